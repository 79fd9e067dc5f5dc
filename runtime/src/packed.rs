//! Weights repacked at load for the packed kernels (`quant::pack8`): eight rows
//! interleaved block by block, already in the order the kernels multiply them, so a
//! product reads one sequential stream and unpacks nothing it has to transpose. Decode of
//! Q5_0 rows streams about twice as fast from this layout as from the file's (see
//! ARCHITECTURE.md, "Packed weights"). The values are the file's, only moved: results are
//! the bits of the same order on the file's rows. Each mode packs every format it has
//! packed kernels for at this ISA: in the exact mode, for every llama.cpp order a product
//! may pick (the 32-element formats, Q4_K and Q6_K).

use std::collections::HashMap;

use quant::GgmlType;

use crate::matmul::Numerics;
use crate::numa::AnonMap;

/// One matrix to pack: its type, row width, and where its bytes are in the file image.
#[derive(Clone, Copy, Debug)]
pub struct PackSource {
    pub ty: GgmlType,
    pub n_in: usize,
    pub n_out: usize,
    pub start: usize,
    pub len: usize,
}

/// Whether a matrix can be packed for `numerics`: a format `quant::pack8` takes, whole
/// groups of eight rows, and on this CPU a packed kernel for every order its products may
/// use (the fast order; or each of llama.cpp's orders a micro-batch may pick, which only
/// Q4_K has all of).
pub fn packable(ty: GgmlType, n_out: usize, numerics: Numerics) -> bool {
    use quant::kernels::{dot_order_for, effective_order, kernels};
    use quant::DotOrder;
    if !quant::packs(ty) || !n_out.is_multiple_of(quant::PACK_ROWS) {
        return false;
    }
    match numerics {
        Numerics::Fast => kernels(ty, DotOrder::Fast)
            .is_some_and(|k| k.order == DotOrder::Fast && k.packed_into.is_some()),
        // Micro-batches of up to nine tokens meet every order `dot_order_for` can pick.
        Numerics::Exact => (1..=9)
            .flat_map(|n| (0..n).map(move |i| dot_order_for(ty, n_out, n, i)))
            .all(|o| kernels(ty, effective_order(ty, o)).is_some_and(|k| k.packed_into.is_some())),
    }
}

/// The packed copies of a model's matrices, found by their offset in the file image.
pub struct PackedWeights {
    /// Anonymous memory, advised into transparent huge pages (one TLB entry per 2 MiB
    /// instead of per 4 KiB page while the weights stream).
    mem: AnonMap,
    at: HashMap<usize, (usize, usize)>,
    numerics: Numerics,
}

impl PackedWeights {
    /// Packs every matrix of `mats` that [`packable`] allows for `numerics` (each distinct
    /// offset once), reading from `image`; `None` when none is. `packed(start, len)` is
    /// called for each matrix as soon as it is packed (to let go of its source pages).
    pub fn new(
        image: &[u8],
        mats: &[PackSource],
        numerics: Numerics,
        packed: &(dyn Fn(usize, usize) + Sync),
    ) -> std::io::Result<Option<PackedWeights>> {
        let mut at = HashMap::new();
        let mut jobs = Vec::new();
        let mut total = 0;
        for m in mats {
            if !packable(m.ty, m.n_out, numerics) || at.contains_key(&m.start) {
                continue;
            }
            at.insert(m.start, (total, m.len));
            jobs.push((*m, total));
            // Each matrix starts on a cache line.
            total += m.len.next_multiple_of(64);
        }
        if jobs.is_empty() {
            return Ok(None);
        }
        let mut mem = AnonMap::new(total)?;
        mem.advise_huge_pages();
        // Split the packing over a few threads by matrix (the biggest first).
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8);
        let mut dsts: Vec<(PackSource, &mut [u8])> = Vec::with_capacity(jobs.len());
        let mut rest = mem.bytes_mut();
        let mut pos = 0;
        for (m, off) in jobs {
            let (_, tail) = rest.split_at_mut(off - pos);
            let (dst, tail) = tail.split_at_mut(m.len);
            dsts.push((m, dst));
            rest = tail;
            pos = off + m.len;
        }
        dsts.sort_by_key(|(m, _)| std::cmp::Reverse(m.len));
        let mut buckets: Vec<Vec<(PackSource, &mut [u8])>> =
            (0..threads).map(|_| Vec::new()).collect();
        let mut load = vec![0usize; threads];
        for d in dsts {
            let i = (0..threads).min_by_key(|&i| load[i]).unwrap_or(0);
            load[i] += d.0.len;
            buckets[i].push(d);
        }
        let results: Vec<Result<(), quant::QuantError>> = std::thread::scope(|s| {
            let hs: Vec<_> = buckets
                .into_iter()
                .map(|b| {
                    s.spawn(move || {
                        for (m, dst) in b {
                            quant::pack8(m.ty, &image[m.start..m.start + m.len], m.n_in, dst)?;
                            packed(m.start, m.len);
                        }
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("packing thread"))
                .collect()
        });
        for r in results {
            r.map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        Ok(Some(PackedWeights { mem, at, numerics }))
    }

    /// The packed bytes of the matrix at `start` in the file image, when it was packed.
    pub fn get(&self, start: usize) -> Option<&[u8]> {
        let &(off, len) = self.at.get(&start)?;
        Some(&self.mem.bytes()[off..off + len])
    }

    /// The numerics the matrices were chosen for.
    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// Bytes of anonymous memory the packed copies take.
    pub fn bytes(&self) -> usize {
        self.mem.len()
    }
}
