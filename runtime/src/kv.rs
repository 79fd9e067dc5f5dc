//! Paged KV cache: a pool of fixed-size blocks shared by all sequences, with an optional
//! prefix cache on top.
//!
//! Each block holds `block_size` token positions for every layer: K and V rows of
//! `n_kv_heads * head_dim` f16 values (f16 as llama.cpp's default cache type, which halves
//! memory and keeps our numerics close to its). A sequence owns an ordered list of block
//! ids (its block table); position `p` lives in block `table[p / block_size]`, slot
//! `p % block_size`.
//!
//! Prefix cache (used by the server; plain `reserve`/`remove_seq` users never see it):
//! a *full* block whose positions have all been computed can be *published* under a
//! chained content key ([`block_hash`]: the previous block's key and this block's tokens),
//! and a new sequence whose prompt starts with the same tokens *attaches* those blocks
//! instead of recomputing them. Blocks carry reference counts (one per block table that
//! holds them). A block whose count drops to zero goes back to the free list, or, if it is
//! published, to an LRU list of cached blocks that stay findable until a new allocation
//! needs the room (least recently released first, a sequence's last block before its
//! first, since a chain is useless without its head).
//!
//! Invariants (checked by [`KvCache::check_invariants`] in the tests):
//! - every block is in exactly one place: the free list (refs 0, unpublished), the LRU list
//!   (refs 0, published) or at least one block table (refs = number of tables holding it);
//! - a published block is full and is never written again: sequences only write positions
//!   at or past their length, and a sequence's published blocks lie wholly below it
//!   (`write` asserts this); shortening a sequence into a published block first gives it a
//!   private copy (or unpublishes it when no one else holds it);
//! - the key map points exactly at the published blocks.

use std::collections::HashMap;

use half::f16;

/// Identifies one sequence (one request's token stream) in the cache.
pub type SeqId = u64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("KV cache full: {needed} more blocks needed, {free} free (of {total})")]
    OutOfBlocks {
        needed: usize,
        free: usize,
        total: usize,
    },
    #[error("sequence {0} is not in the KV cache")]
    UnknownSeq(SeqId),
    #[error("sequence {seq}: position {pos} is not the next position {expected}")]
    NonContiguous {
        seq: SeqId,
        pos: usize,
        expected: usize,
    },
}

/// Geometry of the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub block_size: usize,
    pub n_blocks: usize,
}

impl KvLayout {
    pub fn k_row(&self) -> usize {
        self.n_kv_heads * self.head_dim_k
    }

    pub fn v_row(&self) -> usize {
        self.n_kv_heads * self.head_dim_v
    }

    /// Bytes one token position takes across all layers (K and V).
    pub fn bytes_per_token(&self) -> usize {
        self.n_layers * (self.k_row() + self.v_row()) * std::mem::size_of::<f16>()
    }

    pub fn total_bytes(&self) -> usize {
        self.bytes_per_token() * self.block_size * self.n_blocks
    }

    pub fn capacity_tokens(&self) -> usize {
        self.block_size * self.n_blocks
    }
}

/// Chained content key of one full block: covers the block's tokens and, through
/// `parent`, every token before it, so equal keys mean equal K/V contents (for one model).
pub type BlockHash = u128;

/// Key of a block holding `tokens` that follows the block keyed `parent` (`None` for the
/// first block). SHA-256 truncated to 128 bits: collisions are not a practical concern, and
/// published blocks also keep their tokens, which lookups compare.
pub fn block_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    match parent {
        Some(p) => {
            h.update([1u8]);
            h.update(p.to_le_bytes());
        }
        None => h.update([0u8]),
    }
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let d = h.finalize();
    u128::from_le_bytes(d[..16].try_into().expect("32-byte digest"))
}

/// Appends the keys of the full blocks of `tokens` that `hashes` does not cover yet.
pub fn extend_block_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize) {
    extend_block_hashes_from(hashes, None, tokens, block_size);
}

/// [`extend_block_hashes`] for a chain that starts at `root` (a tenant's, see
/// [`tenant_root`]) instead of at nothing: chains with different roots share no key, so
/// their sequences never share a cached block, whatever their tokens.
pub fn extend_block_hashes_from(
    hashes: &mut Vec<BlockHash>,
    root: Option<BlockHash>,
    tokens: &[u32],
    block_size: usize,
) {
    while (hashes.len() + 1) * block_size <= tokens.len() {
        let i = hashes.len();
        let h = block_hash(
            hashes.last().copied().or(root),
            &tokens[i * block_size..(i + 1) * block_size],
        );
        hashes.push(h);
    }
}

/// The chain root of a cache-isolation domain (a tenant, a `cache_salt`): None for the
/// shared default domain (empty `id`), else a key no token block can produce.
pub fn tenant_root(id: &[u8]) -> Option<BlockHash> {
    if id.is_empty() {
        return None;
    }
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update([2u8]); // distinct from block_hash's 0 (first block) and 1 (chained) tags
    h.update(id);
    let d = h.finalize();
    Some(u128::from_le_bytes(
        d[..16].try_into().expect("32-byte digest"),
    ))
}

#[derive(Debug, Default, Clone)]
struct SeqState {
    blocks: Vec<u32>,
    len: usize,
    /// Leading blocks that are read-only for this sequence: attached from the prefix cache
    /// or published by it (or full and computed when an equal block was already published).
    frozen: usize,
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct BlockMeta {
    refs: u32,
    /// Set while the block is published.
    key: Option<BlockHash>,
    /// The block's tokens while published, compared on lookup.
    tokens: Vec<u32>,
    /// LRU links while cached and unreferenced.
    prev: u32,
    next: u32,
}

pub struct KvCache {
    layout: KvLayout,
    /// Per layer: `n_blocks * block_size * k_row` values.
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    /// Unreferenced, unpublished blocks.
    free: Vec<u32>,
    meta: Vec<BlockMeta>,
    /// Published blocks by key.
    published: HashMap<BlockHash, u32>,
    /// Unreferenced published blocks, least recently released at the head.
    lru_head: u32,
    lru_tail: u32,
    n_lru: usize,
    seqs: HashMap<SeqId, SeqState>,
}

/// `n` f16 zeros from the zeroing allocator (`vec![f16::ZERO; n]` would write every
/// element, touching every page now).
fn zeroed_f16(n: usize) -> Vec<f16> {
    // u16 zeros take the allocator's zeroed path (fresh pages for large sizes).
    let v = std::mem::ManuallyDrop::new(vec![0u16; n]);
    let (ptr, len, cap) = (v.as_ptr() as *mut f16, v.len(), v.capacity());
    // SAFETY: f16 is a transparent u16 (same size and alignment) and all-zero bits are
    // +0.0; the allocation is handed over whole, with its length and capacity.
    unsafe { Vec::from_raw_parts(ptr, len, cap) }
}

impl KvCache {
    /// An empty cache. Its memory is allocated zeroed and not written here: pages are
    /// first touched when K/V rows are stored, so a large cache costs no start-up time and
    /// its pages land where the writing thread's memory policy puts them (not all on the
    /// node of whoever built it).
    pub fn new(layout: KvLayout) -> KvCache {
        let slots = layout.n_blocks * layout.block_size;
        let k = (0..layout.n_layers)
            .map(|_| zeroed_f16(slots * layout.k_row()))
            .collect();
        let v = (0..layout.n_layers)
            .map(|_| zeroed_f16(slots * layout.v_row()))
            .collect();
        // Pop from the end, so block 0 is handed out first.
        let free = (0..layout.n_blocks as u32).rev().collect();
        let meta = vec![
            BlockMeta {
                refs: 0,
                key: None,
                tokens: Vec::new(),
                prev: NIL,
                next: NIL,
            };
            layout.n_blocks
        ];
        KvCache {
            layout,
            k,
            v,
            free,
            meta,
            published: HashMap::new(),
            lru_head: NIL,
            lru_tail: NIL,
            n_lru: 0,
            seqs: HashMap::new(),
        }
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Blocks a reservation can take: never used, or cached but unreferenced (evictable).
    pub fn free_blocks(&self) -> usize {
        self.free.len() + self.n_lru
    }

    /// Blocks held by at least one sequence.
    pub fn used_blocks(&self) -> usize {
        self.layout.n_blocks - self.free_blocks()
    }

    /// Unreferenced blocks still holding a published prefix (a subset of `free_blocks`).
    pub fn cached_blocks(&self) -> usize {
        self.n_lru
    }

    /// Published blocks, referenced or not.
    pub fn published_blocks(&self) -> usize {
        self.published.len()
    }

    /// Number of sequences in the cache.
    pub fn n_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Number of positions stored for `seq` (0 for an unknown sequence).
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.len)
    }

    pub fn has_seq(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Registers an empty sequence (idempotent).
    pub fn add_seq(&mut self, seq: SeqId) {
        self.seqs.entry(seq).or_default();
    }

    /// Releases every block of `seq` (published ones stay cached until evicted).
    pub fn remove_seq(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            // Last block first: it lands nearer the LRU head, so a chain's tail is evicted
            // before its head.
            for &b in s.blocks.iter().rev() {
                self.release(b);
            }
        }
    }

    /// Removes every sequence.
    pub fn clear(&mut self) {
        let ids: Vec<SeqId> = self.seqs.keys().copied().collect();
        for id in ids {
            self.remove_seq(id);
        }
    }

    /// Forgets every published prefix. Blocks in use stay with their sequences.
    pub fn clear_prefix_cache(&mut self) {
        while self.lru_head != NIL {
            let b = self.lru_head;
            self.lru_unlink(b);
            self.free.push(b);
        }
        for (_, b) in self.published.drain() {
            let m = &mut self.meta[b as usize];
            m.key = None;
            m.tokens = Vec::new();
        }
    }

    /// Forgets one published prefix block, as [`clear_prefix_cache`](Self::clear_prefix_cache)
    /// does for all: a cached block becomes free, a block in use stays with its sequences.
    /// False when `key` is not published.
    pub fn forget_prefix(&mut self, key: &BlockHash) -> bool {
        let Some(b) = self.published.remove(key) else {
            return false;
        };
        let m = &mut self.meta[b as usize];
        m.key = None;
        m.tokens = Vec::new();
        if m.refs == 0 {
            self.lru_unlink(b);
            self.free.push(b);
        }
        true
    }

    /// Blocks needed to grow `seq` by `n` positions.
    pub fn blocks_needed(&self, seq: SeqId, n: usize) -> usize {
        let s = self.seqs.get(&seq).map_or(0, |s| s.len);
        let have = self.seqs.get(&seq).map_or(0, |s| s.blocks.len());
        (s + n)
            .div_ceil(self.layout.block_size)
            .saturating_sub(have)
    }

    /// Reserves room for `n` more positions of `seq` (all or nothing) and returns the
    /// first new position. Takes never-used blocks first, then evicts cached ones.
    pub fn reserve(&mut self, seq: SeqId, n: usize) -> Result<usize, KvError> {
        let need = self.blocks_needed(seq, n);
        if need > self.free_blocks() {
            return Err(KvError::OutOfBlocks {
                needed: need,
                free: self.free_blocks(),
                total: self.layout.n_blocks,
            });
        }
        let mut new = Vec::with_capacity(need);
        for _ in 0..need {
            new.push(self.alloc().expect("checked"));
        }
        let s = self.seqs.entry(seq).or_default();
        s.blocks.extend(new);
        let start = s.len;
        s.len += n;
        Ok(start)
    }

    /// Drops positions `>= len` of `seq` (e.g. to undo a reservation), releasing whole
    /// blocks. Cutting into a read-only block first makes it private: unpublished when no
    /// one else holds it, else copied (which needs one free block).
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let bs = self.layout.block_size;
        let s = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if len >= s.len {
            return Ok(());
        }
        let keep = len.div_ceil(bs);
        let cut = len / bs; // the block that keeps only part of its positions, if len % bs != 0
        let partial_frozen = !len.is_multiple_of(bs) && cut < s.frozen;
        if partial_frozen {
            let b = s.blocks[cut];
            let shared = self.meta[b as usize].refs > 1;
            // Blocks released below may become allocatable; count the ones only we hold.
            let released_free = s.blocks[keep..]
                .iter()
                .filter(|&&x| self.meta[x as usize].refs == 1)
                .count();
            if shared && self.free_blocks() + released_free == 0 {
                return Err(KvError::OutOfBlocks {
                    needed: 1,
                    free: 0,
                    total: self.layout.n_blocks,
                });
            }
        }
        let s = self.seqs.get_mut(&seq).expect("checked");
        s.len = len;
        let tail: Vec<u32> = s.blocks.drain(keep..).collect();
        s.frozen = s.frozen.min(cut);
        for &b in tail.iter().rev() {
            self.release(b);
        }
        if partial_frozen {
            let b = self.seqs[&seq].blocks[cut];
            if self.meta[b as usize].refs > 1 {
                let nb = self.alloc().expect("checked above");
                self.copy_block(b, nb, len % bs);
                self.release(b);
                self.seqs.get_mut(&seq).expect("checked").blocks[cut] = nb;
            } else {
                self.unpublish(b);
            }
        }
        Ok(())
    }

    /// Slot index (block * block_size + offset) of a reserved position.
    #[inline]
    pub fn slot(&self, seq: SeqId, pos: usize) -> Result<usize, KvError> {
        let s = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if pos >= s.len {
            return Err(KvError::NonContiguous {
                seq,
                pos,
                expected: s.len,
            });
        }
        let bs = self.layout.block_size;
        Ok(s.blocks[pos / bs] as usize * bs + pos % bs)
    }

    /// Slots of positions `0..len` of `seq`, in order.
    pub fn slots(&self, seq: SeqId, len: usize, out: &mut Vec<usize>) -> Result<(), KvError> {
        let s = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let bs = self.layout.block_size;
        out.clear();
        out.extend((0..len.min(s.len)).map(|p| s.blocks[p / bs] as usize * bs + p % bs));
        Ok(())
    }

    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let m = &self.meta[slot / self.layout.block_size];
        // The prefix cache's safety rests on this: a shared or published block is read-only.
        assert!(
            m.refs <= 1 && m.key.is_none(),
            "write into a shared or published KV block (slot {slot})"
        );
        let kr = self.layout.k_row();
        let vr = self.layout.v_row();
        for (d, &x) in self.k[layer][slot * kr..(slot + 1) * kr].iter_mut().zip(k) {
            *d = f16::from_f32(x);
        }
        for (d, &x) in self.v[layer][slot * vr..(slot + 1) * vr].iter_mut().zip(v) {
            *d = f16::from_f32(x);
        }
    }

    /// K and V storage of one layer, for attention to read by slot.
    pub fn layer(&self, layer: usize) -> (&[f16], &[f16]) {
        (&self.k[layer], &self.v[layer])
    }

    /// How many leading blocks of a sequence with these block keys and tokens are
    /// published (read-only lookup; `hashes[i]` keys `tokens[i*bs..(i+1)*bs]`).
    pub fn prefix_match(&self, hashes: &[BlockHash], tokens: &[u32]) -> usize {
        self.matched_blocks(hashes, tokens).count()
    }

    /// Of the first `n` blocks [`prefix_match`](Self::prefix_match) finds, how many are
    /// unreferenced (attaching them takes them out of `free_blocks`).
    pub fn prefix_match_unreferenced(&self, hashes: &[BlockHash], tokens: &[u32]) -> usize {
        self.matched_blocks(hashes, tokens)
            .filter(|&b| self.meta[b as usize].refs == 0)
            .count()
    }

    fn matched_blocks<'a>(
        &'a self,
        hashes: &'a [BlockHash],
        tokens: &'a [u32],
    ) -> impl Iterator<Item = u32> + 'a {
        let bs = self.layout.block_size;
        hashes
            .iter()
            .enumerate()
            .take(tokens.len() / bs)
            .map_while(move |(i, h)| {
                let &b = self.published.get(h)?;
                (self.meta[b as usize].tokens == tokens[i * bs..(i + 1) * bs]).then_some(b)
            })
    }

    /// Starts an empty (or new) sequence with the published blocks matching its leading
    /// full blocks. Returns the number of positions attached (a multiple of the block
    /// size); the caller continues from there. Pass only the blocks it may share: a caller
    /// that needs logits for its last token must leave that token out.
    pub fn attach_prefix(
        &mut self,
        seq: SeqId,
        hashes: &[BlockHash],
        tokens: &[u32],
    ) -> Result<usize, KvError> {
        if self.seq_len(seq) != 0 {
            return Err(KvError::NonContiguous {
                seq,
                pos: 0,
                expected: self.seq_len(seq),
            });
        }
        let blocks: Vec<u32> = self.matched_blocks(hashes, tokens).collect();
        for &b in &blocks {
            if self.meta[b as usize].refs == 0 {
                self.lru_unlink(b);
            }
            self.meta[b as usize].refs += 1;
        }
        let s = self.seqs.entry(seq).or_default();
        s.len = blocks.len() * self.layout.block_size;
        s.frozen = blocks.len();
        s.blocks = blocks;
        Ok(s.len)
    }

    /// Whether a block with key `key` is published (cached or in use).
    pub fn is_published(&self, key: &BlockHash) -> bool {
        self.published.contains_key(key)
    }

    /// Blocks held by `seq` (0 for an unknown sequence).
    pub fn seq_blocks(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.blocks.len())
    }

    /// Publishes the computed full blocks of `seq` that are not yet read-only, keyed by
    /// `hashes` (see [`extend_block_hashes`]) over the sequence's `tokens`. A block whose
    /// key another block already holds stays private (both hold equal contents). Returns
    /// the number of blocks newly published.
    pub fn publish(&mut self, seq: SeqId, hashes: &[BlockHash], tokens: &[u32]) -> usize {
        let bs = self.layout.block_size;
        let Some(s) = self.seqs.get_mut(&seq) else {
            return 0;
        };
        let upto = hashes.len().min(s.len / bs).min(tokens.len() / bs);
        let from = s.frozen;
        if upto <= from {
            return 0;
        }
        s.frozen = upto;
        let blocks: Vec<u32> = s.blocks[from..upto].to_vec();
        let mut n = 0;
        for (i, b) in (from..upto).zip(blocks) {
            let key = hashes[i];
            if self.published.contains_key(&key) || self.meta[b as usize].key.is_some() {
                continue;
            }
            self.published.insert(key, b);
            let m = &mut self.meta[b as usize];
            m.key = Some(key);
            m.tokens = tokens[i * bs..(i + 1) * bs].to_vec();
            n += 1;
        }
        n
    }

    /// Keys of all published blocks (cached or in use), in no particular order.
    pub fn published_keys(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.published.keys().copied()
    }

    /// Bytes of one block's K and V data as [`export_block`](Self::export_block) writes
    /// them.
    pub fn block_data_len(&self) -> usize {
        let bs = self.layout.block_size;
        (self.layout.k_row() + self.layout.v_row()) * bs * self.layout.n_layers * 2
    }

    /// The tokens of a published block and its K/V data (per layer, K slots then V
    /// slots, f16 little-endian) appended to `data`; false when `key` is not published.
    pub fn export_block(&self, key: &BlockHash, data: &mut Vec<u8>) -> Option<Vec<u32>> {
        let &b = self.published.get(key)?;
        let bs = self.layout.block_size;
        let (kr, vr) = (self.layout.k_row(), self.layout.v_row());
        let s = b as usize * bs;
        data.reserve(self.block_data_len());
        for l in 0..self.layout.n_layers {
            for x in &self.k[l][s * kr..(s + bs) * kr] {
                data.extend_from_slice(&x.to_bits().to_le_bytes());
            }
            for x in &self.v[l][s * vr..(s + bs) * vr] {
                data.extend_from_slice(&x.to_bits().to_le_bytes());
            }
        }
        Some(self.meta[b as usize].tokens.clone())
    }

    /// Adds a block computed elsewhere (a previous run) to the prefix cache as cached and
    /// unreferenced, the most recently released. Uses only free blocks, never evicting;
    /// false (nothing changed) when none is free, the key is already published, or the
    /// sizes do not match the layout.
    pub fn import_block(&mut self, key: BlockHash, tokens: &[u32], data: &[u8]) -> bool {
        let bs = self.layout.block_size;
        if tokens.len() != bs
            || data.len() != self.block_data_len()
            || self.published.contains_key(&key)
        {
            return false;
        }
        let Some(b) = self.free.pop() else {
            return false;
        };
        let (kr, vr) = (self.layout.k_row(), self.layout.v_row());
        let s = b as usize * bs;
        let mut vals = data
            .chunks_exact(2)
            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])));
        for l in 0..self.layout.n_layers {
            for d in &mut self.k[l][s * kr..(s + bs) * kr] {
                *d = vals.next().expect("length checked");
            }
            for d in &mut self.v[l][s * vr..(s + bs) * vr] {
                *d = vals.next().expect("length checked");
            }
        }
        self.published.insert(key, b);
        let m = &mut self.meta[b as usize];
        m.key = Some(key);
        m.tokens = tokens.to_vec();
        m.refs = 0;
        self.lru_push_tail(b);
        true
    }

    /// Checks the block accounting (see the module docs); for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let n = self.layout.n_blocks;
        let mut refs = vec![0u32; n];
        for (id, s) in &self.seqs {
            let bs = self.layout.block_size;
            if s.blocks.len() != s.len.div_ceil(bs) {
                return Err(format!(
                    "seq {id}: {} blocks for {} positions",
                    s.blocks.len(),
                    s.len
                ));
            }
            if s.frozen * bs > s.len {
                return Err(format!("seq {id}: frozen blocks past its length"));
            }
            for (i, &b) in s.blocks.iter().enumerate() {
                refs[b as usize] += 1;
                if self.meta[b as usize].key.is_some() && i >= s.frozen {
                    return Err(format!("seq {id}: published block {b} is writable"));
                }
            }
        }
        let mut place = vec![0u8; n];
        for &b in &self.free {
            place[b as usize] += 1;
            let m = &self.meta[b as usize];
            if m.refs != 0 || m.key.is_some() {
                return Err(format!("free block {b} has refs {} or a key", m.refs));
            }
        }
        let mut lru = 0;
        let mut b = self.lru_head;
        let mut prev = NIL;
        while b != NIL {
            let m = &self.meta[b as usize];
            if m.prev != prev || m.refs != 0 || m.key.is_none() {
                return Err(format!("bad LRU entry {b}"));
            }
            place[b as usize] += 1;
            lru += 1;
            prev = b;
            b = m.next;
        }
        if prev != self.lru_tail || lru != self.n_lru {
            return Err("LRU list length or tail is off".into());
        }
        for i in 0..n {
            let m = &self.meta[i];
            if m.refs != refs[i] {
                return Err(format!(
                    "block {i}: refcount {} but {} tables hold it",
                    m.refs, refs[i]
                ));
            }
            let expect = u8::from(refs[i] == 0);
            if place[i] != expect {
                return Err(format!(
                    "block {i} is on {} lists with {} refs",
                    place[i], refs[i]
                ));
            }
            if let Some(k) = m.key {
                if self.published.get(&k) != Some(&(i as u32)) {
                    return Err(format!("block {i}: key not in the map"));
                }
            }
        }
        for (k, &b) in &self.published {
            if self.meta[b as usize].key != Some(*k) {
                return Err(format!("map entry for block {b} is stale"));
            }
        }
        Ok(())
    }

    fn alloc(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let b = self.lru_head;
                if b == NIL {
                    return None;
                }
                self.lru_unlink(b);
                self.unpublish(b);
                b
            }
        };
        self.meta[b as usize].refs = 1;
        Some(b)
    }

    fn release(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        debug_assert!(m.refs > 0, "release of unreferenced block {b}");
        m.refs -= 1;
        if m.refs == 0 {
            if m.key.is_some() {
                self.lru_push_tail(b);
            } else {
                self.free.push(b);
            }
        }
    }

    fn unpublish(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        if let Some(k) = m.key.take() {
            self.published.remove(&k);
            m.tokens = Vec::new();
        }
    }

    fn copy_block(&mut self, from: u32, to: u32, n_slots: usize) {
        let bs = self.layout.block_size;
        let (kr, vr) = (self.layout.k_row(), self.layout.v_row());
        let (f, t) = (from as usize * bs, to as usize * bs);
        for l in 0..self.layout.n_layers {
            self.k[l].copy_within(f * kr..(f + n_slots) * kr, t * kr);
            self.v[l].copy_within(f * vr..(f + n_slots) * vr, t * vr);
        }
    }

    fn lru_push_tail(&mut self, b: u32) {
        let tail = self.lru_tail;
        {
            let m = &mut self.meta[b as usize];
            m.prev = tail;
            m.next = NIL;
        }
        if tail == NIL {
            self.lru_head = b;
        } else {
            self.meta[tail as usize].next = b;
        }
        self.lru_tail = b;
        self.n_lru += 1;
    }

    fn lru_unlink(&mut self, b: u32) {
        let (prev, next) = {
            let m = &self.meta[b as usize];
            (m.prev, m.next)
        };
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.meta[prev as usize].next = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.meta[next as usize].prev = prev;
        }
        let m = &mut self.meta[b as usize];
        m.prev = NIL;
        m.next = NIL;
        self.n_lru -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_new_cache_touches_no_pages_until_written() {
        let mut kv = KvCache::new(KvLayout {
            n_layers: 1,
            n_kv_heads: 8,
            head_dim_k: 64,
            head_dim_v: 64,
            block_size: 16,
            n_blocks: 1024,
        });
        let (k, _) = kv.layer(0);
        assert!(k.iter().take(4096).all(|x| *x == f16::ZERO));
        let bytes = std::mem::size_of_val(k);
        let before = crate::numa::page_placement(k.as_ptr().cast(), bytes);
        // Only the pages just read (shared zero page or none) may be present.
        assert!(before.absent * 2 > before.total(), "{before:?}");
        kv.add_seq(1);
        kv.reserve(1, 1).unwrap();
        let slot = kv.slot(1, 0).unwrap();
        kv.write(0, slot, &[1.0; 512], &[2.0; 512]);
        assert_eq!(kv.layer(0).0[slot * 512], f16::from_f32(1.0));
    }

    fn cache(n_blocks: usize) -> KvCache {
        KvCache::new(KvLayout {
            n_layers: 2,
            n_kv_heads: 1,
            head_dim_k: 4,
            head_dim_v: 4,
            block_size: 4,
            n_blocks,
        })
    }

    #[test]
    fn reserve_maps_positions_to_blocks_and_frees() {
        let mut c = cache(4);
        assert_eq!(c.reserve(1, 5).unwrap(), 0);
        assert_eq!(c.used_blocks(), 2);
        assert_eq!(c.reserve(2, 3).unwrap(), 0);
        assert_eq!(c.reserve(1, 3).unwrap(), 5);
        assert_eq!(c.used_blocks(), 3);
        let s1: Vec<usize> = (0..8).map(|p| c.slot(1, p).unwrap()).collect();
        assert_eq!(s1, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(c.slot(2, 0).unwrap(), 8);
        assert!(c.slot(2, 3).is_err());
        let e = c.reserve(2, 10).unwrap_err();
        assert_eq!(
            e,
            KvError::OutOfBlocks {
                needed: 3,
                free: 1,
                total: 4
            }
        );
        assert_eq!(c.seq_len(2), 3, "a failed reservation changes nothing");
        c.truncate(1, 4).unwrap();
        assert_eq!(c.used_blocks(), 2);
        c.remove_seq(1);
        c.remove_seq(2);
        assert_eq!(c.free_blocks(), 4);
    }

    #[test]
    fn write_round_trips_through_f16() {
        let mut c = cache(1);
        c.reserve(7, 1).unwrap();
        let slot = c.slot(7, 0).unwrap();
        c.write(1, slot, &[1.0, 2.0, 3.0, 4.0], &[0.5, 0.25, -1.0, 8.0]);
        let (k, v) = c.layer(1);
        assert_eq!(k[slot * 4 + 2].to_f32(), 3.0);
        assert_eq!(v[slot * 4 + 3].to_f32(), 8.0);
    }

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    fn hashes(tokens: &[u32], bs: usize) -> Vec<BlockHash> {
        let mut h = Vec::new();
        extend_block_hashes(&mut h, tokens, bs);
        h
    }

    /// Runs a sequence's "prefill": attach what is cached, reserve the rest, publish.
    fn prefill(c: &mut KvCache, seq: SeqId, t: &[u32]) -> usize {
        let h = hashes(t, 4);
        let usable = (t.len() - 1) / 4;
        let got = c.attach_prefix(seq, &h[..usable], t).unwrap();
        c.reserve(seq, t.len() - got).unwrap();
        c.publish(seq, &h, t);
        c.check_invariants().unwrap();
        got
    }

    #[test]
    fn tenant_roots_separate_chains() {
        let a: Vec<u32> = (0..8).collect();
        let mut plain = Vec::new();
        extend_block_hashes(&mut plain, &a, 4);
        let mut none = Vec::new();
        extend_block_hashes_from(&mut none, tenant_root(b""), &a, 4);
        assert_eq!(plain, none, "the empty tenant is the shared default");
        let (mut t1, mut t2, mut t1b) = (Vec::new(), Vec::new(), Vec::new());
        extend_block_hashes_from(&mut t1, tenant_root(b"alice"), &a, 4);
        extend_block_hashes_from(&mut t2, tenant_root(b"bob"), &a, 4);
        extend_block_hashes_from(&mut t1b, tenant_root(b"alice"), &a, 4);
        assert_eq!(t1, t1b);
        for h in &t1 {
            assert!(!t2.contains(h) && !plain.contains(h));
        }
    }

    #[test]
    fn hash_chain_depends_on_every_earlier_token() {
        let a = toks(12, 1);
        let mut b = a.clone();
        b[0] += 1;
        let (ha, hb) = (hashes(&a, 4), hashes(&b, 4));
        assert_eq!(ha.len(), 3);
        assert!(
            ha.iter().zip(&hb).all(|(x, y)| x != y),
            "a change in block 0 changes all keys"
        );
        let mut c = a.clone();
        c[11] += 1;
        let hc = hashes(&c, 4);
        assert_eq!(ha[..2], hc[..2]);
        assert_ne!(ha[2], hc[2]);
        // Incremental extension equals hashing at once; partial blocks get no key.
        let mut inc = Vec::new();
        extend_block_hashes(&mut inc, &a[..6], 4);
        assert_eq!(inc.len(), 1);
        extend_block_hashes(&mut inc, &a, 4);
        assert_eq!(inc, ha);
        // Same tokens at another depth get another key.
        assert_ne!(block_hash(None, &a[4..8]), ha[1]);
    }

    #[test]
    fn shared_prefix_is_attached_refcounted_and_never_written() {
        let mut c = cache(16);
        let a = toks(10, 3); // 2 full blocks + 2 tokens
        assert_eq!(prefill(&mut c, 1, &a), 0);
        assert_eq!(c.published_blocks(), 2);
        assert_eq!(c.used_blocks(), 3);
        // Same prompt: both full blocks are shared, the partial tail is private.
        assert_eq!(prefill(&mut c, 2, &a), 8);
        assert_eq!(c.used_blocks(), 4);
        assert_eq!(c.slot(1, 5).unwrap(), c.slot(2, 5).unwrap());
        assert_ne!(c.slot(1, 9).unwrap(), c.slot(2, 9).unwrap());
        // A prompt of exactly 2 blocks shares only the first: its last token is recomputed.
        assert_eq!(prefill(&mut c, 3, &a[..8]), 4);
        // A diverging prompt shares only the common full blocks.
        let mut b = a.clone();
        b[5] = 999;
        assert_eq!(prefill(&mut c, 4, &b), 4);
        c.check_invariants().unwrap();
        // Removing the owner keeps shared blocks alive for the others.
        c.remove_seq(1);
        c.check_invariants().unwrap();
        let s2: Vec<usize> = (0..10).map(|p| c.slot(2, p).unwrap()).collect();
        assert!(c.has_seq(2) && s2.len() == 10);
        for id in [2, 3, 4] {
            c.remove_seq(id);
        }
        c.check_invariants().unwrap();
        assert_eq!(c.used_blocks(), 0);
        assert_eq!(c.free_blocks(), 16);
        assert_eq!(
            c.cached_blocks(),
            3,
            "a's 2 blocks and b's first diverging one"
        );
    }

    #[test]
    #[should_panic(expected = "shared or published")]
    fn writing_a_published_block_panics() {
        let mut c = cache(4);
        let a = toks(5, 0);
        prefill(&mut c, 1, &a);
        let slot = c.slot(1, 1).unwrap();
        c.write(0, slot, &[0.0; 4], &[0.0; 4]);
    }

    #[test]
    fn eviction_is_lru_and_only_takes_unreferenced_blocks() {
        let mut c = cache(6);
        let a = toks(9, 1); // blocks a0 a1 + tail
        let b = toks(9, 2);
        prefill(&mut c, 1, &a);
        prefill(&mut c, 2, &b);
        assert_eq!(c.used_blocks(), 6);
        c.remove_seq(1); // a's blocks cached (tail block freed)
        assert_eq!((c.free_blocks(), c.cached_blocks()), (3, 2));
        // b is still referenced: a new sequence can take 3 blocks, evicting a's.
        c.reserve(3, 12).unwrap();
        assert_eq!(c.cached_blocks(), 0);
        assert_eq!(c.prefix_match(&hashes(&a, 4), &a), 0);
        assert_eq!(c.prefix_match(&hashes(&b, 4), &b), 2);
        let e = c.reserve(3, 4).unwrap_err();
        assert!(matches!(
            e,
            KvError::OutOfBlocks {
                needed: 1,
                free: 0,
                ..
            }
        ));
        c.check_invariants().unwrap();

        // LRU order: released first, evicted first; within a sequence, its tail first.
        let mut c = cache(6);
        prefill(&mut c, 1, &a); // 3 blocks
        c.remove_seq(1);
        prefill(&mut c, 2, &b); // 1 free + evicts... needs 3: free list has a's tail + 3 never used
        c.remove_seq(2);
        assert_eq!(c.cached_blocks(), 4);
        c.reserve(9, 4 * 3).unwrap(); // 2 free + 1 eviction: a's second block goes first
        let ha = hashes(&a, 4);
        assert_eq!(
            c.prefix_match(&ha, &a),
            1,
            "a's head survives, its tail was evicted"
        );
        assert_eq!(c.prefix_match(&hashes(&b, 4), &b), 2);
        c.check_invariants().unwrap();
    }

    #[test]
    fn attaching_a_cached_block_takes_it_off_the_lru() {
        let mut c = cache(4);
        let a = toks(9, 5);
        prefill(&mut c, 1, &a);
        c.remove_seq(1);
        assert_eq!(c.cached_blocks(), 2);
        let h = hashes(&a, 4);
        assert_eq!(c.prefix_match_unreferenced(&h[..2], &a), 2);
        assert_eq!(c.attach_prefix(2, &h[..2], &a).unwrap(), 8);
        assert_eq!((c.cached_blocks(), c.used_blocks()), (0, 2));
        // Attaching to a non-empty sequence is refused.
        assert!(c.attach_prefix(2, &h[..2], &a).is_err());
        c.check_invariants().unwrap();
        c.clear_prefix_cache();
        assert_eq!(c.published_blocks(), 0);
        c.check_invariants().unwrap();
        c.remove_seq(2);
        assert_eq!((c.free_blocks(), c.cached_blocks()), (4, 0));
    }

    #[test]
    fn equal_content_published_twice_keeps_one_copy() {
        let mut c = cache(8);
        let a = toks(8, 9);
        let h = hashes(&a, 4);
        // Two sequences compute the same prompt side by side (neither finds it cached).
        c.reserve(1, 8).unwrap();
        c.reserve(2, 8).unwrap();
        assert_eq!(c.publish(1, &h, &a), 2);
        assert_eq!(c.publish(2, &h, &a), 0);
        c.check_invariants().unwrap();
        c.remove_seq(2);
        assert_eq!(
            c.cached_blocks(),
            0,
            "the duplicate went back to the free list"
        );
        c.remove_seq(1);
        assert_eq!(c.cached_blocks(), 2);
        c.check_invariants().unwrap();
    }

    #[test]
    fn exported_blocks_import_into_another_cache_bit_for_bit() {
        let mut a = cache(8);
        let t = toks(20, 3);
        a.add_seq(1);
        a.reserve(1, 20).unwrap();
        let (kr, vr) = (a.layout().k_row(), a.layout().v_row());
        let mut slots = Vec::new();
        a.slots(1, 20, &mut slots).unwrap();
        for (p, &slot) in slots.iter().enumerate() {
            for l in 0..2 {
                let k: Vec<f32> = (0..kr).map(|i| (p * 7 + i + l) as f32 * 0.37).collect();
                let v: Vec<f32> = (0..vr).map(|i| -((p + i * 3 + l) as f32) * 0.11).collect();
                a.write(l, slot, &k, &v);
            }
        }
        let hs = hashes(&t, 4);
        assert_eq!(a.publish(1, &hs, &t), 5);
        let mut data = Vec::new();
        let tk = a.export_block(&hs[2], &mut data).unwrap();
        assert_eq!(tk, t[8..12]);
        assert_eq!(data.len(), a.block_data_len());
        let mut b = cache(2);
        assert!(b.import_block(hs[2], &tk, &data));
        assert!(!b.import_block(hs[2], &tk, &data), "already published");
        assert!(!b.import_block(hs[3], &tk, &data[1..]), "wrong size");
        b.check_invariants().unwrap();
        assert_eq!((b.cached_blocks(), b.free_blocks()), (1, 2));
        let mut again = Vec::new();
        b.export_block(&hs[2], &mut again).unwrap();
        assert_eq!(again, data);
        // Imports never evict: with no free block left they refuse.
        assert!(b.import_block(hs[3], &t[12..16], &data));
        assert!(!b.import_block(hs[4], &t[16..20], &data));
        b.check_invariants().unwrap();
        assert!(a
            .export_block(&block_hash(None, &[9; 4]), &mut again)
            .is_none());
    }

    #[test]
    fn truncating_into_a_shared_block_copies_it() {
        let mut c = cache(8);
        let a = toks(9, 4);
        prefill(&mut c, 1, &a);
        assert_eq!(prefill(&mut c, 2, &a), 8);
        let shared = c.slot(2, 4).unwrap();
        c.write(1, c.slot(2, 8).unwrap(), &[1.0; 4], &[2.0; 4]);
        // Seq 2 cuts into its second (shared) block: it gets a private copy of slots 4..6.
        c.truncate(2, 6).unwrap();
        c.check_invariants().unwrap();
        let own = c.slot(2, 4).unwrap();
        assert_ne!(own, shared);
        assert_eq!(
            c.layer(0).0[own * 4..own * 4 + 8],
            c.layer(0).0[shared * 4..shared * 4 + 8]
        );
        c.reserve(2, 1).unwrap();
        let p6 = c.slot(2, 6).unwrap();
        c.write(0, p6, &[3.0; 4], &[3.0; 4]); // allowed: private now
                                              // Seq 1 alone holds its blocks: cutting into one unpublishes it.
        c.remove_seq(2);
        c.truncate(1, 2).unwrap();
        c.check_invariants().unwrap();
        assert_eq!(c.prefix_match(&hashes(&a, 4), &a), 0);
        c.reserve(1, 1).unwrap();
        let p2 = c.slot(1, 2).unwrap();
        c.write(0, p2, &[0.0; 4], &[0.0; 4]);
    }

    proptest::proptest! {
        /// Random interleavings of prefill, decode, publish, truncate, removal and cache
        /// clearing keep the accounting consistent and never lose a block.
        #[test]
        fn random_operations_keep_invariants(ops in proptest::collection::vec((0u8..6, 0u64..5, 0usize..40), 1..120)) {
            let mut c = cache(24);
            let mut hist: HashMap<SeqId, Vec<u32>> = HashMap::new();
            for (op, seq, n) in ops {
                match op {
                    0 => {
                        if !c.has_seq(seq) {
                            // Prompts from a tiny alphabet so prefixes collide often.
                            let t: Vec<u32> = (0..n.max(1)).map(|i| ((i as u64 * 3 + seq % 2) % 4) as u32).collect();
                            let h = hashes(&t, 4);
                            let usable = (t.len() - 1) / 4;
                            let got = c.attach_prefix(seq, &h[..usable], &t).unwrap();
                            if c.reserve(seq, t.len() - got).is_ok() {
                                c.publish(seq, &h, &t);
                                hist.insert(seq, t);
                            } else {
                                c.remove_seq(seq);
                            }
                        }
                    }
                    1 => {
                        if let Some(t) = hist.get_mut(&seq) {
                            if c.reserve(seq, 1).is_ok() {
                                t.push(n as u32 % 4);
                                let h = hashes(t, 4);
                                c.publish(seq, &h, t);
                            }
                        }
                    }
                    2 => {
                        c.remove_seq(seq);
                        hist.remove(&seq);
                    }
                    3 => {
                        if let Some(t) = hist.get_mut(&seq) {
                            let len = n.min(t.len());
                            if c.truncate(seq, len).is_ok() {
                                t.truncate(len);
                            }
                        }
                    }
                    4 => c.clear_prefix_cache(),
                    _ => {
                        // Any sequence's slots are unique to it unless shared read-only.
                        let mut seen = HashMap::new();
                        for (&id, t) in &hist {
                            for p in 0..t.len() {
                                let s = c.slot(id, p).unwrap();
                                if let Some(&(other, q)) = seen.get(&s) {
                                    proptest::prop_assert_eq!(q, p, "slot {} at different positions of {} and {}", s, other, id);
                                    proptest::prop_assert_eq!(&hist[&other][..=p], &t[..=p]);
                                }
                                seen.insert(s, (id, p));
                            }
                        }
                    }
                }
                proptest::prop_assert_eq!(c.check_invariants(), Ok(()));
                for (&id, t) in &hist {
                    proptest::prop_assert_eq!(c.seq_len(id), t.len());
                }
            }
            let ids: Vec<SeqId> = hist.keys().copied().collect();
            for id in ids {
                c.remove_seq(id);
            }
            proptest::prop_assert_eq!(c.used_blocks(), 0);
            proptest::prop_assert_eq!(c.free_blocks(), 24);
        }
    }
}
