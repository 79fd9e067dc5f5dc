//! A code-editing workload: each prompt holds a Python module and asks for it back with
//! one identifier renamed, so most of the answer repeats the prompt (what editors and
//! coding agents ask of a model all day, and what prompt-lookup speculative decoding
//! is for). The modules are assembled from the function templates below with names drawn
//! from a seeded generator: deterministic for a seed, different per request.

use rand::{Rng, SeedableRng};

use crate::SampledRequest;

/// Function templates; `{a}`..`{d}` are identifiers, `{n}` a number.
const TEMPLATES: &[&str] = &[
    "def load_{a}(path):\n    with open(path) as f:\n        {b} = json.load(f)\n    {c} = []\n    for item in {b}:\n        {c}.append(item[\"{d}\"])\n    return {c}\n",
    "def total_{a}({b}):\n    {c} = 0\n    for value in {b}:\n        if value > {n}:\n            {c} += value\n    return {c}\n",
    "class {A}:\n    def __init__(self, {b}, {c}):\n        self.{b} = {b}\n        self.{c} = {c}\n\n    def __repr__(self):\n        return f\"{A}({b}={{self.{b}!r}}, {c}={{self.{c}!r}})\"\n",
    "def group_{a}({b}, key):\n    {c} = {{}}\n    for item in {b}:\n        {c}.setdefault(key(item), []).append(item)\n    return {c}\n",
    "def find_{a}({b}, {d}):\n    for index, item in enumerate({b}):\n        if item.{d} == {d}:\n            return index\n    return -1\n",
    "def parse_{a}(line):\n    parts = line.strip().split(\",\")\n    if len(parts) != {n}:\n        raise ValueError(f\"expected {n} fields, got {{len(parts)}}\")\n    {b} = [p.strip() for p in parts]\n    return {b}\n",
    "def retry_{a}(fn, {b}={n}):\n    {c} = None\n    for attempt in range({b}):\n        try:\n            return fn()\n        except OSError as e:\n            {c} = e\n            time.sleep(0.1 * (attempt + 1))\n    raise {c}\n",
    "def window_{a}({b}, size):\n    {c} = []\n    for start in range(0, len({b}) - size + 1):\n        {c}.append(sum({b}[start:start + size]) / size)\n    return {c}\n",
];

const WORDS: &[&str] = &[
    "orders", "records", "items", "users", "events", "samples", "rows", "entries", "values",
    "prices", "totals", "counts", "names", "accounts", "invoices", "metrics", "readings", "tasks",
    "jobs", "files", "lines", "tokens", "scores", "weights", "limit", "buffer", "result", "cache",
    "index", "status", "customer", "region", "label", "amount",
];

fn fill(t: &str, rng: &mut impl Rng) -> String {
    let mut pick = || WORDS[rng.gen_range(0..WORDS.len())];
    let (a, b, c, d) = (pick(), pick(), pick(), pick());
    // Distinct names within one function, so a rename has one meaning.
    let (b, c, d) = (format!("{b}_in"), format!("{c}_out"), format!("{d}_key"));
    let cap = {
        let mut s = a.to_string();
        s[..1].make_ascii_uppercase();
        s
    };
    let n = rng.gen_range(2..9).to_string();
    t.replace("{A}", &cap)
        .replace("{a}", a)
        .replace("{b}", &b)
        .replace("{c}", &c)
        .replace("{d}", &d)
        .replace("{n}", &n)
        .replace("{{", "{")
        .replace("}}", "}")
}

/// `n` requests, each a module of `functions` (inclusive range) functions to rewrite
/// with one identifier renamed; each asks for the module's length in tokens plus a
/// margin.
pub fn code_edit(
    n: usize,
    functions: (usize, usize),
    seed: u64,
    count: &dyn Fn(&str) -> usize,
) -> Vec<SampledRequest> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let k = rng.gen_range(functions.0..=functions.1);
            let mut code = String::from("import json\nimport time\n\n\n");
            let mut names = Vec::new();
            for i in 0..k {
                let f = fill(TEMPLATES[rng.gen_range(0..TEMPLATES.len())], &mut rng);
                if let Some(name) = f.strip_prefix("def ").and_then(|s| s.split('(').next()) {
                    names.push(name.to_string());
                }
                if i > 0 {
                    code.push_str("\n\n");
                }
                code.push_str(&f);
            }
            let old = match names.is_empty() {
                true => "json".to_string(),
                false => names[rng.gen_range(0..names.len())].clone(),
            };
            let new = format!("{old}_v2");
            let prompt = format!(
                "Rename the function `{old}` to `{new}` in the following Python module. Reply \
                 with the complete modified module in one code block and nothing else.\n\n\
                 ```python\n{code}```\n"
            );
            let out = count(&code) + 24;
            SampledRequest {
                prompt_len: count(&prompt),
                prompt,
                expected_output_len: out,
                id: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    #[test]
    fn deterministic_distinct_and_sized() {
        let a = code_edit(6, (4, 8), 1, &words);
        let b = code_edit(6, (4, 8), 1, &words);
        assert_eq!(a, b);
        assert_ne!(a[0].prompt, a[1].prompt);
        for r in &a {
            assert!(r.prompt.contains("```python\nimport json"));
            for p in ["{a}", "{A}", "{b}", "{c}", "{d}", "{n}", "{{", "}}"] {
                assert!(!r.prompt.contains(p), "{p} left in {}", r.prompt);
            }
            // The answer is as long as the code it repeats.
            assert!(r.expected_output_len > 24 && r.expected_output_len < r.prompt_len + 24);
        }
    }
}
