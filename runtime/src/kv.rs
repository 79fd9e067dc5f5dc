//! Paged KV cache: a pool of fixed-size blocks shared by all sequences.
//!
//! Each block holds `block_size` token positions for every layer: K and V rows of
//! `n_kv_heads * head_dim` f16 values (f16 as llama.cpp's default cache type, which halves
//! memory and keeps our numerics close to its). A sequence owns an ordered list of block
//! ids (its block table); position `p` lives in block `table[p / block_size]`, slot
//! `p % block_size`. Freed blocks go back on a free list in O(1).

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

#[derive(Debug, Default, Clone)]
struct SeqState {
    blocks: Vec<u32>,
    len: usize,
}

pub struct KvCache {
    layout: KvLayout,
    /// Per layer: `n_blocks * block_size * k_row` values.
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    free: Vec<u32>,
    seqs: HashMap<SeqId, SeqState>,
}

impl KvCache {
    pub fn new(layout: KvLayout) -> KvCache {
        let slots = layout.n_blocks * layout.block_size;
        let k = (0..layout.n_layers)
            .map(|_| vec![f16::ZERO; slots * layout.k_row()])
            .collect();
        let v = (0..layout.n_layers)
            .map(|_| vec![f16::ZERO; slots * layout.v_row()])
            .collect();
        // Pop from the end, so block 0 is handed out first.
        let free = (0..layout.n_blocks as u32).rev().collect();
        KvCache {
            layout,
            k,
            v,
            free,
            seqs: HashMap::new(),
        }
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn used_blocks(&self) -> usize {
        self.layout.n_blocks - self.free.len()
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

    /// Frees every block of `seq`.
    pub fn remove_seq(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            self.free.extend(s.blocks.into_iter().rev());
        }
    }

    /// Removes every sequence.
    pub fn clear(&mut self) {
        let ids: Vec<SeqId> = self.seqs.keys().copied().collect();
        for id in ids {
            self.remove_seq(id);
        }
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
    /// first new position.
    pub fn reserve(&mut self, seq: SeqId, n: usize) -> Result<usize, KvError> {
        let need = self.blocks_needed(seq, n);
        if need > self.free.len() {
            return Err(KvError::OutOfBlocks {
                needed: need,
                free: self.free.len(),
                total: self.layout.n_blocks,
            });
        }
        let s = self.seqs.entry(seq).or_default();
        for _ in 0..need {
            s.blocks.push(self.free.pop().expect("checked"));
        }
        let start = s.len;
        s.len += n;
        Ok(start)
    }

    /// Drops positions `>= len` of `seq` (e.g. to undo a reservation), freeing whole blocks.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let bs = self.layout.block_size;
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if len < s.len {
            s.len = len;
            let keep = len.div_ceil(bs);
            while s.blocks.len() > keep {
                self.free.push(s.blocks.pop().expect("non-empty"));
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
