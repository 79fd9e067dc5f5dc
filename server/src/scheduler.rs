//! The continuous-batching scheduler: plain state over the KV cache's block accounting,
//! with no model, no threads and no HTTP, so every policy below is unit-tested directly.
//!
//! Each step it builds one batch under a token budget:
//! 1. **decode first**: every running sequence with exactly one token to compute gets it,
//!    so generation never waits behind a prompt;
//! 2. **prefill chunks** of running sequences still in their prompt fill the rest of the
//!    budget, oldest first (with chunking off a prompt goes in whole);
//! 3. **admission** of waiting sequences (first come, first served) while there are free
//!    sequence slots, budget, and KV blocks for their whole prompt beyond what the running
//!    prompts still need. An admitted sequence first attaches the longest cached prefix of
//!    full blocks (never its last token, which must be computed for logits). A sequence
//!    whose next uncached block is being computed right now by a running prompt waits for
//!    it instead of computing it again (a burst of requests sharing a system prompt costs
//!    one prefill).
//!
//! **Speculative drafts** ride on decodes: a sequence may carry draft tokens after its
//! last sampled one ([`Scheduler::set_draft`]), computed in the same item when the budget
//! and the free blocks allow (else dropped, never at another sequence's expense), kept
//! out of the prefix cache until verified, and cut back to what the model agreed with by
//! [`Scheduler::resolve_draft`].
//!
//! When a decode needs a block and none is free, the newest running sequence is
//! **preempted**: its blocks are released and it goes back to the front of the queue with
//! everything it generated, to be recomputed later (bit-identical logits make this
//! invisible in its output). A running request is never failed for lack of memory: with
//! one sequence left, its whole context fits (the engine checks the cache holds one full
//! context at startup).

use std::collections::{HashSet, VecDeque};

use std::collections::HashMap;
use std::sync::Arc;

use runtime::kv::{extend_block_hashes_from, BlockHash, KvCache, SeqId};

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most sequences running at once.
    pub max_seqs: usize,
    /// Most tokens in one step's batch (decode tokens plus prefill chunks).
    pub max_batch_tokens: usize,
    /// Split prompts across steps; off, a prompt is computed in one step.
    pub chunked_prefill: bool,
    pub prefix_caching: bool,
}

/// One sequence as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct SeqEntry {
    pub id: SeqId,
    /// Prompt, then every generated token.
    pub tokens: Vec<u32>,
    pub n_prompt: usize,
    /// Positions in the KV cache.
    pub n_computed: usize,
    /// Keys of the full blocks of `tokens`, for the prefix cache.
    hashes: Vec<BlockHash>,
    /// Prompt positions found in the prefix cache at first admission.
    pub cached_tokens: usize,
    pub admitted_once: bool,
    pub n_preemptions: u32,
    /// The cache-isolation domain: where its block keys' chain starts (None: shared) and
    /// how metrics name it.
    pub root: Option<BlockHash>,
    pub tenant: Arc<str>,
    /// Never attach cached blocks: every position is computed (an embedding pooled over
    /// every token's hidden state needs them all). Its own blocks are still published.
    pub no_prefix_reuse: bool,
    /// The last `n_draft` tokens are speculative guesses awaiting verification.
    pub n_draft: usize,
}

impl SeqEntry {
    pub fn new(id: SeqId, prompt: Vec<u32>) -> SeqEntry {
        assert!(!prompt.is_empty(), "a sequence needs at least one token");
        SeqEntry {
            id,
            n_prompt: prompt.len(),
            tokens: prompt,
            n_computed: 0,
            hashes: Vec::new(),
            cached_tokens: 0,
            admitted_once: false,
            n_preemptions: 0,
            root: None,
            tenant: Arc::from("default"),
            no_prefix_reuse: false,
            n_draft: 0,
        }
    }

    /// The same sequence computing every position itself ([`SeqEntry::no_prefix_reuse`]).
    pub fn without_prefix_reuse(mut self) -> SeqEntry {
        self.no_prefix_reuse = true;
        self
    }

    /// The same sequence in tenant `tenant` (its blocks are keyed from `root`).
    pub fn in_tenant(mut self, root: Option<BlockHash>, tenant: &str) -> SeqEntry {
        self.root = root;
        self.tenant = Arc::from(tenant);
        self
    }

    /// Tokens not yet in the KV cache.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.n_computed
    }

    pub fn n_generated(&self) -> usize {
        self.verified_len() - self.n_prompt
    }

    /// Tokens not counting an unverified draft.
    pub fn verified_len(&self) -> usize {
        self.tokens.len() - self.n_draft
    }

    /// Verified tokens not yet in the KV cache (1 for a sequence ready to decode).
    fn to_compute(&self) -> usize {
        self.verified_len().saturating_sub(self.n_computed)
    }

    fn drop_draft(&mut self) {
        self.tokens.truncate(self.verified_len());
        self.n_draft = 0;
    }
}

/// One sequence's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanItem {
    pub seq: SeqId,
    /// First position (the sequence's current length in the cache).
    pub start: usize,
    pub len: usize,
    /// Whether this chunk ends at the last known token, so its logits give the next one.
    pub logits: bool,
    /// Draft tokens at the end of this decode item: each needs its own logits row.
    pub draft: usize,
}

#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Decode items first, then prefill chunks.
    pub items: Vec<PlanItem>,
    pub admitted: Vec<SeqId>,
    pub preempted: Vec<SeqId>,
    /// Prompt positions attached from the prefix cache at this step's admissions.
    pub cache_hit_tokens: usize,
}

impl Plan {
    pub fn n_tokens(&self) -> usize {
        self.items.iter().map(|i| i.len).sum()
    }
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    waiting: VecDeque<SeqEntry>,
    /// In admission order (the newest is preempted first).
    running: Vec<SeqEntry>,
    /// Which tenant published each cached key (pruned as the cache evicts).
    published_by: HashMap<BlockHash, Arc<str>>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Scheduler {
        // Every running sequence's decode token fits in each step.
        assert!(cfg.max_seqs > 0 && cfg.max_batch_tokens >= cfg.max_seqs);
        Scheduler {
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            published_by: HashMap::new(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn add(&mut self, seq: SeqEntry) {
        self.waiting.push_back(seq);
    }

    pub fn n_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn n_running(&self) -> usize {
        self.running.len()
    }

    /// Every sequence, running then waiting.
    pub fn entries(&self) -> impl Iterator<Item = &SeqEntry> {
        self.running.iter().chain(self.waiting.iter())
    }

    /// Cached prefix blocks per tenant that are still in `kv` (forgets evicted ones).
    pub fn cached_by_tenant(&mut self, kv: &KvCache) -> HashMap<Arc<str>, usize> {
        self.published_by.retain(|h, _| kv.is_published(h));
        let mut out = HashMap::new();
        for t in self.published_by.values() {
            *out.entry(t.clone()).or_insert(0) += 1;
        }
        out
    }

    /// The tenant that published a cached key, if known.
    pub fn tenant_of(&self, key: &BlockHash) -> Option<&Arc<str>> {
        self.published_by.get(key)
    }

    /// Forgets the cached prefix blocks that tenants `pick` accepts (by label) published;
    /// other tenants' blocks stay. Returns the blocks forgotten.
    pub fn forget_tenant_prefixes(
        &mut self,
        kv: &mut KvCache,
        pick: impl Fn(&str) -> bool,
    ) -> usize {
        let keys: Vec<BlockHash> = self
            .published_by
            .iter()
            .filter(|(_, t)| pick(t))
            .map(|(k, _)| *k)
            .collect();
        let mut n = 0;
        for k in keys {
            self.published_by.remove(&k);
            n += usize::from(kv.forget_prefix(&k));
        }
        n
    }

    /// Records the tenant of a block that entered the cache from elsewhere (a restart).
    pub fn note_published(&mut self, key: BlockHash, tenant: Arc<str>) {
        self.published_by.insert(key, tenant);
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn get(&self, id: SeqId) -> Option<&SeqEntry> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.id == id)
    }

    pub fn is_running(&self, id: SeqId) -> bool {
        self.running.iter().any(|s| s.id == id)
    }

    /// Ids of every sequence, running then waiting.
    pub fn ids(&self) -> Vec<SeqId> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .map(|s| s.id)
            .collect()
    }

    /// Records a sampled token (the next step computes it).
    pub fn append_token(&mut self, id: SeqId, token: u32) {
        let s = self
            .running
            .iter_mut()
            .find(|s| s.id == id)
            .expect("append_token: sequence is running");
        s.tokens.push(token);
    }

    /// Whether prompt tokens wait to be computed: a sequence queued, or a running one
    /// still in its prompt (or recomputing after preemption).
    pub fn prefill_pending(&self) -> bool {
        !self.waiting.is_empty() || self.running.iter().any(|s| s.to_compute() > 1)
    }

    /// Gives a running sequence that is ready to decode (one token to compute) these
    /// draft tokens after it, replacing any draft it had. The next plan computes them with
    /// the decode where they fit; [`Scheduler::resolve_draft`] then keeps the agreed part.
    pub fn set_draft(&mut self, id: SeqId, draft: &[u32]) {
        let Some(s) = self.running.iter_mut().find(|s| s.id == id) else {
            return;
        };
        s.drop_draft();
        if s.to_compute() == 1 {
            s.tokens.extend_from_slice(draft);
            s.n_draft = draft.len();
        }
    }

    /// Drops every running sequence's draft not yet computed (drafting paused).
    pub fn drop_drafts(&mut self) {
        for s in self.running.iter_mut().filter(|s| s.n_draft > 0) {
            s.drop_draft();
        }
    }

    /// After a step that computed a sequence's draft: the first `accepted` draft tokens
    /// were the model's own; the rest leave the tokens and the cache.
    pub fn resolve_draft(&mut self, id: SeqId, accepted: usize, kv: &mut KvCache) {
        let Some(s) = self.running.iter_mut().find(|s| s.id == id) else {
            return;
        };
        let accepted = accepted.min(s.n_draft);
        let keep = s.tokens.len() - (s.n_draft - accepted);
        s.tokens.truncate(keep);
        s.n_draft = 0;
        if s.n_computed > keep {
            s.n_computed = keep;
            // Drafts are never published, so the cut is in private blocks: it cannot fail.
            kv.truncate(id, keep)
                .expect("cutting unpublished draft positions");
        }
    }

    /// Removes a sequence wherever it is and releases its blocks.
    pub fn remove(&mut self, id: SeqId, kv: &mut KvCache) -> Option<SeqEntry> {
        kv.remove_seq(id);
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            return Some(self.running.remove(i));
        }
        let i = self.waiting.iter().position(|s| s.id == id)?;
        self.waiting.remove(i)
    }

    /// Builds the next step's batch, admitting and preempting as needed. The plan fits in
    /// the free blocks of `kv` as left by this call; an empty plan means there is nothing
    /// to do.
    pub fn schedule(&mut self, kv: &mut KvCache) -> Plan {
        let mut plan = Plan::default();
        loop {
            self.try_schedule(kv, &mut plan);
            if !plan.items.is_empty() || self.running.is_empty() {
                return plan;
            }
            // Running prompts hold every block and none can move: give one up.
            self.preempt_newest(kv, &mut plan);
        }
    }

    fn try_schedule(&mut self, kv: &mut KvCache, plan: &mut Plan) {
        let bs = kv.layout().block_size;
        let mut budget = self.cfg.max_batch_tokens;
        // Blocks this plan takes once the forward pass reserves them.
        let mut reserved = 0usize;

        // 1. Decodes, oldest first; the newest give way when blocks run out.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if self.running[i].to_compute() != 1 {
                i += 1;
                continue;
            }
            let id = self.running[i].id;
            // A draft rides along only where the budget and the free blocks allow.
            let d = self.running[i].n_draft;
            if d > 0
                && (1 + d > budget || kv.blocks_needed(id, 1 + d) > kv.free_blocks() - reserved)
            {
                self.running[i].drop_draft();
            }
            let len = 1 + self.running[i].n_draft;
            let need = kv.blocks_needed(id, len);
            let mut preempted_self = false;
            while need > kv.free_blocks() - reserved {
                if self.running.len() > i + 1 {
                    self.preempt_at(self.running.len() - 1, kv, plan);
                } else {
                    self.preempt_at(i, kv, plan);
                    preempted_self = true;
                    break;
                }
            }
            if preempted_self {
                break;
            }
            reserved += need;
            budget -= len;
            plan.items.push(PlanItem {
                seq: id,
                start: self.running[i].n_computed,
                len,
                logits: true,
                draft: len - 1,
            });
            i += 1;
        }

        // 2. Prefill chunks of running prompts, oldest first.
        for i in 0..self.running.len() {
            if budget == 0 {
                break;
            }
            let s = &self.running[i];
            if s.to_compute() <= 1 {
                continue;
            }
            let Some(item) = self.chunk(s, kv, budget, reserved, plan) else {
                break;
            };
            reserved += kv.blocks_needed(s.id, item.len);
            budget = budget.saturating_sub(item.len);
            plan.items.push(item);
        }

        // 3. Admission.
        let mut pending = self.pending_blocks(bs);
        // Blocks the running prompts still need to finish, beyond what this plan reserves.
        let committed: usize = self
            .running
            .iter()
            .map(|s| kv.blocks_needed(s.id, s.remaining()))
            .sum();
        let mut committed = committed.saturating_sub(reserved);
        let mut w = 0;
        while w < self.waiting.len() && self.running.len() < self.cfg.max_seqs && budget > 0 {
            let s = &mut self.waiting[w];
            extend_block_hashes_from(&mut s.hashes, s.root, &s.tokens, bs);
            // The last token is always computed: it gives the logits.
            let usable = match s.no_prefix_reuse {
                true => 0,
                false => (s.tokens.len() - 1) / bs,
            };
            let (hit, hit_unref) = if self.cfg.prefix_caching {
                (
                    kv.prefix_match(&s.hashes[..usable], &s.tokens),
                    kv.prefix_match_unreferenced(&s.hashes[..usable], &s.tokens),
                )
            } else {
                (0, 0)
            };
            if self.cfg.prefix_caching && hit < usable && pending.contains(&s.hashes[hit]) {
                w += 1; // its next block is being computed by a running prompt
                continue;
            }
            let need = s.tokens.len().div_ceil(bs) - hit;
            let avail = kv.free_blocks() - reserved;
            let fits = avail >= committed + hit_unref + need;
            let forced = self.running.is_empty() && plan.items.is_empty();
            if !fits && !forced {
                break; // first come, first served: no one overtakes a request that waits
            }
            let mut s = self.waiting.remove(w).expect("index in range");
            let got = if self.cfg.prefix_caching {
                kv.attach_prefix(s.id, &s.hashes[..usable], &s.tokens)
                    .expect("a waiting sequence has nothing in the cache")
            } else {
                0
            };
            debug_assert_eq!(got, hit * bs);
            s.n_computed = got;
            if !s.admitted_once {
                s.admitted_once = true;
                s.cached_tokens = got.min(s.n_prompt);
                plan.cache_hit_tokens += s.cached_tokens;
            }
            plan.admitted.push(s.id);
            let item = self.chunk(&s, kv, budget, reserved, plan);
            self.running.push(s);
            let s = self.running.last().expect("just pushed");
            if self.cfg.prefix_caching && s.remaining() > 1 {
                // Later arrivals with the same prompt wait for these blocks.
                pending.extend(s.hashes.iter().skip(s.n_computed / bs).copied());
            }
            if let Some(item) = item {
                let total = kv.blocks_needed(s.id, s.remaining());
                let now = kv.blocks_needed(s.id, item.len);
                reserved += now;
                committed += total - now;
                budget = budget.saturating_sub(item.len);
                plan.items.push(item);
            } else {
                break;
            }
        }
    }

    /// The next prefill chunk of `s` under the budget and free blocks, if any fits.
    fn chunk(
        &self,
        s: &SeqEntry,
        kv: &KvCache,
        budget: usize,
        reserved: usize,
        plan: &Plan,
    ) -> Option<PlanItem> {
        let bs = kv.layout().block_size;
        let rem = s.remaining();
        let mut n = if self.cfg.chunked_prefill {
            rem.min(budget)
        } else if rem <= budget || !plan.items.iter().any(|i| i.len > 1) {
            // Whole prompts only; one may exceed the budget, alone among prefills.
            rem
        } else {
            return None;
        };
        // Room in the sequence's last block plus the blocks still free.
        let slack = kv.seq_len(s.id).div_ceil(bs) * bs - kv.seq_len(s.id);
        let fit = slack + (kv.free_blocks() - reserved) * bs;
        if n > fit {
            if !self.cfg.chunked_prefill {
                return None;
            }
            n = fit;
        }
        (n > 0).then_some(PlanItem {
            seq: s.id,
            start: s.n_computed,
            len: n,
            logits: n == rem,
            draft: 0,
        })
    }

    /// Keys of blocks that running prompts have yet to compute.
    fn pending_blocks(&self, bs: usize) -> HashSet<BlockHash> {
        let mut set = HashSet::new();
        if !self.cfg.prefix_caching {
            return set;
        }
        for s in &self.running {
            if s.to_compute() > 1 {
                let from = s.n_computed / bs;
                set.extend(s.hashes.iter().skip(from).copied());
            }
        }
        set
    }

    fn preempt_newest(&mut self, kv: &mut KvCache, plan: &mut Plan) {
        let i = self.running.len() - 1;
        self.preempt_at(i, kv, plan);
    }

    fn preempt_at(&mut self, i: usize, kv: &mut KvCache, plan: &mut Plan) {
        let mut s = self.running.remove(i);
        s.drop_draft();
        kv.remove_seq(s.id);
        // Items already planned for it (a prefill chunk) go too.
        plan.items.retain(|it| it.seq != s.id);
        s.n_computed = 0;
        s.n_preemptions += 1;
        plan.preempted.push(s.id);
        self.waiting.push_front(s);
    }

    /// Records that the plan's forward pass succeeded: advances each sequence and publishes
    /// its newly completed full blocks to the prefix cache. Returns the blocks published.
    pub fn complete(&mut self, plan: &Plan, kv: &mut KvCache) -> usize {
        let bs = kv.layout().block_size;
        let mut published = 0;
        for item in &plan.items {
            let Some(s) = self.running.iter_mut().find(|s| s.id == item.seq) else {
                continue;
            };
            debug_assert_eq!(s.n_computed, item.start);
            s.n_computed += item.len;
            debug_assert_eq!(kv.seq_len(s.id), s.n_computed);
            if self.cfg.prefix_caching {
                // Draft positions wait for their verification.
                let verified = s.n_computed.min(s.verified_len());
                extend_block_hashes_from(&mut s.hashes, s.root, &s.tokens[..verified], bs);
                let n = kv.publish(s.id, &s.hashes, &s.tokens);
                published += n;
                if n > 0 {
                    for h in &s.hashes {
                        if kv.is_published(h) {
                            self.published_by
                                .entry(*h)
                                .or_insert_with(|| s.tenant.clone());
                        }
                    }
                }
            }
        }
        published
    }

    /// Undoes a failed forward pass's plan for these sequences: they leave the scheduler.
    pub fn fail(&mut self, plan: &Plan, kv: &mut KvCache) -> Vec<SeqEntry> {
        plan.items
            .iter()
            .filter_map(|it| self.remove(it.seq, kv))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::kv::KvLayout;

    const BS: usize = 4;

    fn kv(n_blocks: usize) -> KvCache {
        KvCache::new(KvLayout {
            n_layers: 1,
            n_kv_heads: 1,
            head_dim_k: 1,
            head_dim_v: 1,
            block_size: BS,
            n_blocks,
        })
    }

    fn sched(max_seqs: usize, budget: usize) -> Scheduler {
        Scheduler::new(SchedulerConfig {
            max_seqs,
            max_batch_tokens: budget,
            chunked_prefill: true,
            prefix_caching: true,
        })
    }

    fn prompt(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 31 + salt).collect()
    }

    /// Stands in for the forward pass: reserves what the plan says, as `Model::forward`.
    fn run(s: &mut Scheduler, kv: &mut KvCache) -> Plan {
        let plan = s.schedule(kv);
        let mut need = 0;
        for it in &plan.items {
            assert_eq!(
                kv.seq_len(it.seq),
                it.start,
                "plan starts at the cache length"
            );
            need += kv.blocks_needed(it.seq, it.len);
        }
        assert!(
            need <= kv.free_blocks(),
            "plan fits: {need} > {}",
            kv.free_blocks()
        );
        for it in &plan.items {
            kv.reserve(it.seq, it.len).unwrap();
        }
        s.complete(&plan, kv);
        // Sample a token for every sequence whose logits came back.
        for it in plan.items.iter().filter(|i| i.logits) {
            s.append_token(it.seq, 7);
        }
        kv.check_invariants().unwrap();
        plan
    }

    fn items(p: &Plan) -> Vec<(SeqId, usize, usize, bool)> {
        p.items
            .iter()
            .map(|i| (i.seq, i.start, i.len, i.logits))
            .collect()
    }

    #[test]
    fn drafts_ride_on_decodes_and_only_verified_tokens_are_published() {
        let mut kv = kv(64);
        let mut s = sched(4, 64);
        s.add(SeqEntry::new(1, prompt(6, 1)));
        run(&mut s, &mut kv); // the prompt, then a sampled token: 7 tokens, 6 computed
        s.set_draft(1, &[10, 11, 12, 13, 14]);
        let p = s.schedule(&mut kv);
        assert_eq!(items(&p), vec![(1, 6, 6, true)]);
        assert_eq!(p.items[0].draft, 5);
        kv.reserve(1, 6).unwrap();
        s.complete(&p, &mut kv);
        // Only the verified tokens' full block is published, not the one with drafts.
        assert_eq!(kv.published_blocks(), 1);
        // Two drafts agreed: 9 tokens stay, and the cache is cut to them.
        s.resolve_draft(1, 2, &mut kv);
        assert_eq!(kv.seq_len(1), 9);
        let e = s.get(1).unwrap();
        assert_eq!((e.tokens.len(), e.n_draft, e.n_computed), (9, 0, 9));
        assert_eq!(&e.tokens[7..], &[10, 11]);
        assert_eq!(e.n_generated(), 3);
        s.append_token(1, 20);
        kv.check_invariants().unwrap();
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(1, 9, 1, true)]);
        assert_eq!(kv.published_blocks(), 2);
        // A draft that does not fit the budget is dropped; the decode goes alone.
        let mut kv2 = super::tests::kv(64);
        let mut s2 = sched(2, 3);
        s2.add(SeqEntry::new(5, prompt(2, 9)));
        run(&mut s2, &mut kv2);
        s2.set_draft(5, &[1, 2, 3, 4]);
        let p = run(&mut s2, &mut kv2);
        assert_eq!(items(&p), vec![(5, 2, 1, true)]);
        assert_eq!(s2.get(5).unwrap().n_draft, 0);
        assert_eq!(s2.get(5).unwrap().tokens.len(), 4);
        // A paused server drops drafts it has not computed yet.
        s2.set_draft(5, &[1, 2]);
        assert_eq!(s2.get(5).unwrap().n_draft, 2);
        s2.drop_drafts();
        assert_eq!(s2.get(5).unwrap().n_draft, 0);
        assert_eq!(s2.get(5).unwrap().tokens.len(), 4);
        // A sequence still in its prompt takes no draft.
        s2.add(SeqEntry::new(6, prompt(40, 2)));
        let _ = s2.schedule(&mut kv2);
        s2.set_draft(6, &[1, 2]);
        assert_eq!(s2.get(6).unwrap().n_draft, 0);
    }

    #[test]
    fn decode_goes_first_and_prompts_are_chunked_under_the_budget() {
        let mut kv = kv(64);
        let mut s = sched(4, 8);
        s.add(SeqEntry::new(1, prompt(3, 0)));
        assert_eq!(items(&run(&mut s, &mut kv)), vec![(1, 0, 3, true)]);
        s.add(SeqEntry::new(2, prompt(20, 1)));
        // Seq 1 decodes; seq 2's prompt takes the other 7 tokens of the budget.
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(1, 3, 1, true), (2, 0, 7, false)]);
        assert_eq!(p.admitted, vec![2]);
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(1, 4, 1, true), (2, 7, 7, false)]);
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(1, 5, 1, true), (2, 14, 6, true)]);
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(1, 6, 1, true), (2, 20, 1, true)]);
        assert_eq!(s.get(2).unwrap().n_generated(), 2);
    }

    #[test]
    fn without_chunking_a_prompt_goes_whole() {
        let mut kv = kv(64);
        let mut s = Scheduler::new(SchedulerConfig {
            max_seqs: 4,
            max_batch_tokens: 8,
            chunked_prefill: false,
            prefix_caching: false,
        });
        s.add(SeqEntry::new(1, prompt(3, 0)));
        run(&mut s, &mut kv);
        s.add(SeqEntry::new(2, prompt(20, 1)));
        s.add(SeqEntry::new(3, prompt(5, 2)));
        let p = run(&mut s, &mut kv);
        // The long prompt goes in one piece, over the budget; the next one waits.
        assert_eq!(items(&p), vec![(1, 3, 1, true), (2, 0, 20, true)]);
        let p = run(&mut s, &mut kv);
        assert_eq!(
            items(&p),
            vec![(1, 4, 1, true), (2, 20, 1, true), (3, 0, 5, true)]
        );
    }

    #[test]
    fn max_seqs_bounds_running_and_finished_sequences_make_room() {
        let mut kv = kv(64);
        let mut s = sched(2, 64);
        for id in 1..=3 {
            s.add(SeqEntry::new(id, prompt(5, id as u32)));
        }
        let p = run(&mut s, &mut kv);
        assert_eq!(p.admitted, vec![1, 2]);
        assert_eq!((s.n_running(), s.n_waiting()), (2, 1));
        s.remove(1, &mut kv).unwrap();
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(2, 5, 1, true), (3, 0, 5, true)]);
        s.remove(2, &mut kv);
        s.remove(3, &mut kv);
        assert_eq!(kv.used_blocks(), 0);
        assert!(s.is_idle());
    }

    #[test]
    fn a_cached_prefix_is_attached_but_the_last_token_is_recomputed() {
        let mut kv = kv(64);
        let mut s = sched(4, 64);
        let p16 = prompt(16, 3);
        s.add(SeqEntry::new(1, p16.clone()));
        run(&mut s, &mut kv);
        s.remove(1, &mut kv);
        assert_eq!(kv.cached_blocks(), 4);
        // Same 16 tokens: 3 blocks come from the cache, block 4 is recomputed.
        s.add(SeqEntry::new(2, p16.clone()));
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(2, 12, 4, true)]);
        assert_eq!(
            (p.cache_hit_tokens, s.get(2).unwrap().cached_tokens),
            (12, 12)
        );
        // A longer prompt with the same start gets all 4 blocks.
        let mut longer = p16.clone();
        longer.extend([1, 2, 3]);
        s.add(SeqEntry::new(3, longer));
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(2, 16, 1, true), (3, 16, 3, true)]);
        assert_eq!(s.get(3).unwrap().cached_tokens, 16);
    }

    #[test]
    fn generated_blocks_are_published_too() {
        let mut kv = kv(64);
        let mut s = sched(4, 64);
        s.add(SeqEntry::new(1, prompt(6, 0)));
        for _ in 0..4 {
            run(&mut s, &mut kv);
        }
        // 6 prompt + 3 computed generated tokens = 9 positions: 2 full blocks published.
        assert_eq!(kv.published_blocks(), 2);
        let e = s.remove(1, &mut kv).unwrap();
        s.add(SeqEntry::new(2, e.tokens.clone()));
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(2, 8, 2, true)]);
    }

    #[test]
    fn identical_prompts_in_flight_wait_for_the_first_instead_of_recomputing() {
        let mut kv = kv(64);
        let mut s = sched(8, 8);
        let p = prompt(18, 5);
        for id in 1..=3 {
            s.add(SeqEntry::new(id, p.clone()));
        }
        // Only seq 1 computes the shared blocks; 2 and 3 wait for them.
        let pl = run(&mut s, &mut kv);
        assert_eq!(items(&pl), vec![(1, 0, 8, false)]);
        assert_eq!(s.n_waiting(), 2);
        let pl = run(&mut s, &mut kv);
        assert_eq!(items(&pl), vec![(1, 8, 8, false)]);
        // Seq 1's 16 computed positions are published: 2 and 3 attach 16 and compute 2.
        let pl = run(&mut s, &mut kv);
        assert_eq!(
            items(&pl),
            vec![(1, 16, 2, true), (2, 16, 2, true), (3, 16, 2, true)]
        );
        assert_eq!(pl.cache_hit_tokens, 32);
        // 4 shared full blocks + 3 private tail blocks.
        assert_eq!(kv.used_blocks(), 4 + 3);
    }

    #[test]
    fn with_prefix_caching_off_nothing_is_shared() {
        let mut kv = kv(64);
        let mut s = Scheduler::new(SchedulerConfig {
            max_seqs: 8,
            max_batch_tokens: 64,
            chunked_prefill: true,
            prefix_caching: false,
        });
        for id in 1..=2 {
            s.add(SeqEntry::new(id, prompt(9, 5)));
        }
        let pl = run(&mut s, &mut kv);
        assert_eq!(items(&pl), vec![(1, 0, 9, true), (2, 0, 9, true)]);
        assert_eq!(kv.published_blocks(), 0);
    }

    #[test]
    fn out_of_blocks_preempts_the_newest_and_it_resumes_from_its_tokens() {
        // 6 blocks = 24 positions; 3 sequences each grow past 8 positions.
        let mut kv = kv(6);
        let mut s = sched(3, 64);
        for id in 1..=3 {
            s.add(SeqEntry::new(id, prompt(7, id as u32 * 100)));
        }
        let p = run(&mut s, &mut kv);
        assert_eq!(p.admitted, vec![1, 2, 3]);
        // Step 2: all at 8 positions, each fits in 2 blocks.
        run(&mut s, &mut kv);
        assert_eq!(kv.free_blocks(), 0);
        // Step 3: each needs a third block; 3 is preempted, freeing 2 for 1 and 2.
        let p = run(&mut s, &mut kv);
        assert_eq!(p.preempted, vec![3]);
        assert_eq!(items(&p), vec![(1, 8, 1, true), (2, 8, 1, true)]);
        let e3 = s.get(3).unwrap();
        assert_eq!(
            (e3.n_computed, e3.tokens.len(), e3.n_generated()),
            (0, 9, 2)
        );
        // 1 and 2 finish; 3 comes back and recomputes its prompt and generated tokens.
        s.remove(1, &mut kv);
        s.remove(2, &mut kv);
        let p = run(&mut s, &mut kv);
        assert_eq!(p.admitted, vec![3]);
        // Its first 8 positions were published before preemption (if not evicted since).
        let it = &p.items[0];
        assert_eq!((it.seq, it.start + it.len, it.logits), (3, 9, true));
    }

    #[test]
    fn long_prompts_are_admitted_only_when_they_can_finish() {
        // Two chunked 30-token prompts side by side would fill the cache before either
        // finishes; the second waits instead.
        let mut kv = kv(8);
        let mut s = Scheduler::new(SchedulerConfig {
            max_seqs: 2,
            max_batch_tokens: 16,
            chunked_prefill: true,
            prefix_caching: false,
        });
        s.add(SeqEntry::new(1, prompt(30, 1)));
        s.add(SeqEntry::new(2, prompt(30, 2)));
        let mut done = false;
        for _ in 0..40 {
            let p = run(&mut s, &mut kv);
            assert!(!p.items.is_empty(), "progress every step");
            if s.get(1).is_some_and(|e| e.n_generated() >= 2) {
                done = true;
                break;
            }
        }
        assert!(done, "seq 1 finishes its prompt and generates");
    }

    #[test]
    fn admission_waits_for_blocks_first_come_first_served() {
        let mut kv = kv(8);
        let mut s = sched(4, 64);
        s.add(SeqEntry::new(1, prompt(20, 1))); // 5 blocks
        run(&mut s, &mut kv);
        s.add(SeqEntry::new(2, prompt(16, 2))); // 4 blocks: does not fit next to seq 1
        s.add(SeqEntry::new(3, prompt(2, 3))); // would fit, but may not overtake
        let p = run(&mut s, &mut kv);
        assert_eq!(items(&p), vec![(1, 20, 1, true)]);
        assert_eq!(s.n_waiting(), 2);
        s.remove(1, &mut kv);
        let p = run(&mut s, &mut kv);
        assert_eq!(p.admitted, vec![2, 3]);
    }

    #[test]
    fn removal_frees_everything_wherever_the_sequence_is() {
        let mut kv = kv(32);
        let mut s = sched(1, 4);
        s.add(SeqEntry::new(1, prompt(10, 1)));
        s.add(SeqEntry::new(2, prompt(10, 2)));
        run(&mut s, &mut kv); // seq 1 mid-prompt, seq 2 waiting
        assert!(kv.used_blocks() > 0);
        assert!(s.remove(2, &mut kv).is_some());
        assert!(s.remove(1, &mut kv).is_some());
        assert!(s.remove(1, &mut kv).is_none());
        assert_eq!(kv.used_blocks(), 0);
        kv.check_invariants().unwrap();
    }

    /// Random arrivals, finishes and cancellations on a tiny cache: every plan fits, every
    /// step makes progress, every sequence eventually generates its tokens, and no block
    /// leaks.
    #[test]
    fn random_workloads_always_progress_and_never_leak() {
        use rand::{Rng, SeedableRng};
        let (mut preemptions, mut hits) = (0, 0);
        for seed in 0..20u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut kv = kv(12); // 48 positions
            let mut s = Scheduler::new(SchedulerConfig {
                max_seqs: rng.gen_range(1..5),
                max_batch_tokens: rng.gen_range(4..20),
                chunked_prefill: rng.gen_bool(0.7),
                prefix_caching: rng.gen_bool(0.7),
            });
            let mut next_id = 0;
            let mut want = std::collections::HashMap::new();
            let mut finished = 0;
            for _step in 0..2000 {
                if next_id < 30 && rng.gen_bool(0.3) {
                    next_id += 1;
                    let len = rng.gen_range(1..30);
                    let salt = rng.gen_range(0..3);
                    s.add(SeqEntry::new(next_id, prompt(len, salt)));
                    want.insert(next_id, 48 - len.max(1)); // never past the context
                }
                if s.is_idle() {
                    if next_id >= 30 {
                        break;
                    }
                    continue;
                }
                let p = run(&mut s, &mut kv);
                assert!(!p.items.is_empty(), "seed {seed}: no progress");
                preemptions += p.preempted.len();
                hits += p.cache_hit_tokens;
                for id in s.ids() {
                    let e = s.get(id).unwrap();
                    let cap = want[&id].min(6);
                    let cancel = rng.gen_bool(0.01);
                    if e.n_generated() >= cap || cancel {
                        s.remove(id, &mut kv);
                        finished += 1;
                    }
                }
            }
            assert_eq!(finished, 30, "seed {seed}: all sequences finish");
            assert_eq!(kv.used_blocks(), 0, "seed {seed}");
            kv.check_invariants().unwrap();
        }
        assert!(
            preemptions > 0 && hits > 0,
            "{preemptions} preemptions, {hits} hits"
        );
    }
}
