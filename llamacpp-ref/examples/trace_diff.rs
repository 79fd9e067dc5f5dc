//! Where do our numbers leave llama.cpp's? Evaluates one token sequence with both engines,
//! records every intermediate tensor (llama.cpp through its graph callback, ours through
//! `Workspace::trace`) and prints, per layer and tensor, the largest absolute and relative
//! difference and the share of bit-identical values.
//!
//! `cargo run --release -p llamacpp-ref --example trace_diff -- MODEL [PROMPT] [N_TOKENS]`
//!
//! `TRACE_DETAIL=1` also prints, for the first tensor that differs, which rows (tokens)
//! differ and the first differing value of each; `TRACE_NAMES=1` lists llama.cpp's
//! tensor names. (Gemma 3's `Qrope` never matches: llama.cpp records its query before
//! the attention scale, ours after.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use llamacpp_ref::{RefModel, RefOptions};
use runtime::model::Model;
use runtime::runner::Runner;

type Trace = Arc<Mutex<Vec<(String, usize, Vec<f32>)>>>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = runtime::registry::resolve(args.get(1).map_or("smollm2-135m", |s| s.as_str()))
        .expect("model");
    let prompt = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "The quick brown fox jumps over the lazy dog. Once upon a time".into());
    let n_tok: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(32);
    let threads = 2;

    let mut theirs = RefModel::load(
        &path,
        &RefOptions {
            n_ctx: 1024,
            n_threads: threads,
            n_threads_batch: threads,
            ..Default::default()
        },
    )
    .unwrap();
    let mut toks = theirs.tokenize(&prompt, true, true).unwrap();
    if toks.len() < n_tok {
        let more = theirs.greedy(&toks, n_tok - toks.len()).unwrap();
        toks.extend(more);
    }
    toks.truncate(n_tok);
    drop(theirs);
    let mut theirs = RefModel::load(
        &path,
        &RefOptions {
            n_ctx: 1024,
            n_threads: threads,
            n_threads_batch: threads,
            trace: true,
            ..Default::default()
        },
    )
    .unwrap();
    let ref_logits = theirs.logits_all(&toks).unwrap();
    let ref_trace = theirs.take_trace();

    let model = Arc::new(Model::load(&path).unwrap());
    let mut ours = Runner::new(model, threads as usize, 1024);
    let rec: Trace = Arc::default();
    let sink = rec.clone();
    ours.ws.trace = Some(Box::new(move |name, il, v| {
        sink.lock()
            .unwrap()
            .push((name.to_string(), il, v.to_vec()));
    }));
    let our_logits = ours.logits_all(&toks).unwrap();
    let our_trace = std::mem::take(&mut *rec.lock().unwrap());

    // llama.cpp names a tensor several times (after the matmul, the reshape, the rope...):
    // keep all of them per name, compare with the one of equal size, last first.
    let mut by_name: HashMap<String, Vec<&llamacpp_ref::RefTensor>> = HashMap::new();
    for t in &ref_trace {
        by_name.entry(t.name.clone()).or_default().push(t);
    }
    if std::env::var_os("TRACE_NAMES").is_some() {
        for t in &ref_trace {
            eprintln!("{} {:?}", t.name, t.ne);
        }
    }
    let alias = |name: &str| -> Vec<&'static str> {
        match name {
            "Qrope" => vec!["Qcur"],
            "Krope" => vec!["Kcur"],
            "kqv_out" => vec!["kqv_out", "__attn_out"],
            "ffn_inp" => vec!["sa_out"],
            "ffn_act" => vec!["ffn_gate_par", "ffn_swiglu", "ffn_geglu", "ffn_gelu"],
            _ => vec![],
        }
    };
    let mut detailed = false;
    println!(
        "{:<14} {:>5} {:>12} {:>12} {:>8}  ref-tensor",
        "tensor", "layer", "max|d|", "max|d|/max|x|", "same%"
    );
    for (name, il, ours_v) in &our_trace {
        let mut cands: Vec<String> = vec![if *il == usize::MAX {
            name.clone()
        } else {
            format!("{name}-{il}")
        }];
        for a in alias(name) {
            cands.push(if *il == usize::MAX {
                a.to_string()
            } else {
                format!("{a}-{il}")
            });
        }
        let mut found = None;
        if name == "wo_out" {
            // Unnamed in llama.cpp's graph: the node right after kqv_out.
            let kqv = format!("kqv_out-{il}");
            if let Some(i) = ref_trace.iter().position(|t| t.name == kqv) {
                let t = &ref_trace[i + 1];
                if t.data.len() == ours_v.len() {
                    found = Some((t.name.clone(), t));
                }
            }
        }
        'outer: for c in cands.iter().filter(|_| found.is_none()) {
            if let Some(list) = by_name.get(c) {
                let pick: Vec<_> = list
                    .iter()
                    .filter(|t| t.data.len() == ours_v.len())
                    .collect();
                // Qcur/Kcur/Vcur are named after the matmul, after the bias (qwen2), after
                // the reshape to heads and after RoPE: ours are the last 2-D one (the
                // projection with its bias) and, for *rope, the last one.
                let t = if name.ends_with("rope") {
                    pick.last()
                } else if name.ends_with("cur") {
                    pick.iter().rev().find(|t| t.ne[2] == 1)
                } else {
                    pick.first()
                };
                if let Some(t) = t {
                    found = Some((c.clone(), *t));
                    break 'outer;
                }
            }
        }
        let Some((rname, t)) = found else {
            println!(
                "{name:<14} {:>5} (no llama.cpp tensor of this size)",
                il_str(*il)
            );
            continue;
        };
        let (mut maxd, mut maxx, mut same) = (0f32, 0f32, 0usize);
        for (a, b) in ours_v.iter().zip(&t.data) {
            maxd = maxd.max((a - b).abs());
            maxx = maxx.max(b.abs());
            same += (a.to_bits() == b.to_bits()) as usize;
        }
        println!(
            "{name:<14} {:>5} {maxd:>12.3e} {:>12.3e} {:>7.2}%  {rname} {:?}",
            il_str(*il),
            maxd / maxx.max(1e-30),
            100.0 * same as f64 / ours_v.len() as f64,
            t.ne
        );
        if same < ours_v.len() && !detailed && std::env::var_os("TRACE_DETAIL").is_some() {
            // The first tensor that differs: which rows (tokens) and columns.
            detailed = true;
            let cols = t.ne[0];
            for (r, (a, b)) in ours_v.chunks(cols).zip(t.data.chunks(cols)).enumerate() {
                let diff: Vec<usize> = (0..cols)
                    .filter(|&c| a[c].to_bits() != b[c].to_bits())
                    .collect();
                if !diff.is_empty() {
                    let c = diff[0];
                    println!(
                        "    row {r}: {} of {cols} differ, first col {c}: ours {:e} theirs {:e}",
                        diff.len(),
                        a[c],
                        b[c]
                    );
                }
            }
        }
    }
    let nv = ref_logits.len() / toks.len();
    let agree = (0..toks.len())
        .filter(|&p| {
            runtime::sampling::argmax(&ref_logits[p * nv..(p + 1) * nv])
                == runtime::sampling::argmax(&our_logits[p * nv..(p + 1) * nv])
        })
        .count();
    println!("top-1 agreement {agree}/{}", toks.len());
}

fn il_str(il: usize) -> String {
    if il == usize::MAX {
        "-".into()
    } else {
        il.to_string()
    }
}
