//! The offloaded layers of a model as ggml graphs on one ggml device.
//!
//! Our runtime stays in charge: it schedules, owns the KV bookkeeping (which slot holds
//! which position of which sequence) and runs the layers that stay on the CPU with its own
//! kernels. The last `n` layers (llama.cpp's `-ngl` counts from the top, and `-ngl` above
//! the layer count also moves the output layer) run here: their weights are uploaded once
//! at load in their GGUF block formats (ggml has the same ones), their K and V caches live
//! on the device indexed by the same slot numbers as our paged cache, and each forward
//! call crosses the boundary once: the hidden state of the batch goes up, the rows with
//! logits (or the logits) come back.
//!
//! The layers are built from the same declaration our CPU executor reads
//! (`crate::model::spec`): the same tensors in the same [`LayerW`] shape, uploaded, and
//! one graph step per declared feature.
//!
//! One graph per call covers all offloaded layers for all tokens of a continuous batch:
//! K/V rows are written with `ggml_set_rows` at each token's slot, attention gathers the
//! slots of the batch's sequences once per layer and a mask keeps each token to its own
//! sequence, causal order and (gemma3's local layers) sliding window, so a token never sees
//! another sequence's keys.

use std::ffi::{c_void, CString};
use std::ptr::null_mut;
use std::sync::Mutex;

use ggml_sys::sys::{self, ggml_context, ggml_tensor, GgmlLib};
use ggml_sys::{cstr, Ggml};
use quant::ops::rope::RopeStyle;

use super::{DeviceBatch, OffloadError};
use crate::model::spec::{Act, FfnSpec, Gating, LayerSpec, ModelSpec};
use crate::model::weights::{FfnKind, FfnW, GateUp, LayerW, Qkv};
use crate::model::Config;

/// Graph nodes a call may create (about 40 per dense layer, 60 with experts, plus the
/// ends).
const GRAPH_SIZE: usize = 32768;

/// The gathered KV slots are padded to a multiple of this (masked), as llama.cpp pads its
/// KV view, so decode steps keep one graph shape for 256 tokens at a time.
const KV_PAD: usize = 256;

/// What the model hands over for upload: a matrix's GGUF bytes (a stack of `n_expert`
/// for experts) or an f32 vector.
pub(crate) enum Weight<'a> {
    Mat {
        ty: quant::GgmlType,
        n_in: usize,
        n_out: usize,
        n_expert: usize,
        bytes: &'a [u8],
    },
    Vec(&'a [f32]),
}

/// One offloaded layer on the device: its tensors (the model's [`LayerW`], uploaded),
/// its declaration, its K/V cache and its RoPE factors.
struct DevLayer {
    w: LayerW<*mut ggml_tensor, *mut ggml_tensor>,
    spec: LayerSpec,
    k_cache: *mut ggml_tensor,
    v_cache: *mut ggml_tensor,
    freq_factors: Option<*mut ggml_tensor>,
}

/// How a graph's intermediate tensors get memory and where its nodes run.
enum Alloc {
    /// Everything on the device: one allocator, one backend.
    Device(sys::ggml_gallocr_t),
    /// Some weights (`--n-cpu-moe`'s experts) live in host memory: ggml's scheduler
    /// splits the graph between the device and the CPU backend (last), copying
    /// activations across, as llama.cpp runs such a model.
    Sched(sys::ggml_backend_sched_t),
}

struct State {
    alloc: Alloc,
    /// Memory for the per-call graph context (tensor and graph metadata only).
    meta: Vec<u8>,
    /// Largest compute buffer seen, for the memory report.
    compute_bytes: usize,
    /// Device calls so far, and the call from which the device acts lost
    /// (`RLLAMA_OFFLOAD_FAIL_AT`, for testing what a lost device does to its callers).
    calls: usize,
    fail_at: Option<usize>,
    /// The graph of the last shape, reused while the shape stays.
    graph: Option<Graph>,
    builds: usize,
    reuses: usize,
}

/// A built and allocated graph with its inputs and result.
struct Graph {
    key: (usize, usize, usize),
    ctx: *mut ggml_context,
    gf: *mut sys::ggml_cgraph,
    x: *mut ggml_tensor,
    pos: *mut ggml_tensor,
    slot: *mut ggml_tensor,
    kv: *mut ggml_tensor,
    /// One mask per distinct window of the layers (0: the whole context), as `windows`.
    masks: Vec<*mut ggml_tensor>,
    rows: *mut ggml_tensor,
    /// The result in pieces of consecutive output rows: (tensor, rows). One piece unless
    /// the logits of all rows would exceed what the device can bind as one tensor.
    res: Vec<(*mut ggml_tensor, usize)>,
}

/// One device the offloaded layers run on: its backend, and the weights and K/V caches of
/// the layers assigned to it.
struct Dev {
    dev: sys::ggml_backend_dev_t,
    backend: sys::ggml_backend_t,
    /// ggml's device name (`CPU`, `Vulkan0`, `RPC0`).
    name: String,
    w_ctx: *mut ggml_context,
    w_buf: sys::ggml_backend_buffer_t,
    kv_ctx: *mut ggml_context,
    kv_buf: sys::ggml_backend_buffer_t,
    /// Bytes on the device: weights, KV cache.
    weight_bytes: usize,
    kv_bytes: usize,
    /// The global indices of its layers, and whether the output layer is here.
    layers: std::ops::Range<usize>,
    output: bool,
}

/// The offloaded layers on one device or, split as `--tensor-split` says, on several.
pub struct DeviceLayers {
    g: &'static Ggml,
    /// In device order; each holds a consecutive run of the layers.
    devs: Vec<Dev>,
    /// ggml's device names, comma-separated.
    pub device: String,
    /// Index of the first offloaded layer.
    pub first_layer: usize,
    layers: Vec<DevLayer>,
    /// Output norm and matrix when the output layer is offloaded too.
    output: Option<(*mut ggml_tensor, *mut ggml_tensor)>,
    /// The device holding the output layer (an index into `devs`).
    output_dev: usize,
    /// Why the output layer was asked for but kept on the CPU.
    output_on_cpu: Option<String>,
    cfg: Config,
    n_slots: usize,
    /// Attention as ggml's fused flash-attention op (else two products around a softmax).
    flash_attn: bool,
    /// `--n-cpu-moe`: the experts kept in host memory, and the CPU backend that runs them.
    host: Option<HostExperts>,
    /// The CPU backend ggml's scheduler ends its list with when several devices share
    /// the graph and no host experts bring one.
    sched_cpu: Option<sys::ggml_backend_t>,
    /// Bytes on the devices together: weights, KV cache.
    pub weight_bytes: usize,
    pub kv_bytes: usize,
    state: Mutex<State>,
}

/// The expert stacks of the first offloaded layers that `--n-cpu-moe` keeps on the CPU.
struct HostExperts {
    ctx: *mut ggml_context,
    buf: sys::ggml_backend_buffer_t,
    backend: sys::ggml_backend_t,
    /// Global indices of the layers whose experts are here.
    layers: std::ops::Range<usize>,
    bytes: usize,
}

// SAFETY: the raw pointers are ggml objects owned by this value; every use of the mutable
// ones (the allocator, the KV tensors written by a graph) happens under `state`'s lock,
// and the weight tensors are only read after load.
unsafe impl Send for DeviceLayers {}
unsafe impl Sync for DeviceLayers {}

fn gtype(ty: quant::GgmlType) -> sys::ggml_type {
    ty as u32 as sys::ggml_type
}

/// Frees what `devs` allocated (buffers, contexts, backends).
///
/// # Safety
/// Each handle is live or null, and none is used afterwards.
unsafe fn free_devs(l: &GgmlLib, devs: &mut Vec<Dev>) {
    for d in devs.drain(..) {
        if !d.w_buf.is_null() {
            l.ggml_backend_buffer_free(d.w_buf);
        }
        if !d.kv_buf.is_null() {
            l.ggml_backend_buffer_free(d.kv_buf);
        }
        l.ggml_free(d.w_ctx);
        l.ggml_free(d.kv_ctx);
        l.ggml_backend_free(d.backend);
    }
}

impl DeviceLayers {
    /// Uploads `layers` (the model's last layers, in order, starting at `first_layer`)
    /// and, when `output` is given, the output norm and matrix; allocates their K/V caches
    /// for `n_slots` slots. The devices are `offload`'s (`--device`, else the `--rpc`
    /// servers' devices then every GPU), the layers split over them in consecutive runs
    /// by `--tensor-split` (default: by free memory). `threads` sets the CPU backend's
    /// threads where a device is ggml's CPU.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: &Config,
        spec: &ModelSpec,
        first_layer: usize,
        layers: &[LayerW<Weight<'_>, &[f32]>],
        output: Option<(&[f32], Weight<'_>)>,
        n_slots: usize,
        offload: &super::OffloadSpec,
        threads: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<DeviceLayers, OffloadError> {
        let (spec_mem_limit, fail_at) = (offload.mem_limit, offload.fail_at);
        let g = Ggml::global().map_err(|e| OffloadError::NoGgml(e.to_string()))?;
        let _ = g.load_backends();
        let l = g.raw();
        let rpc_devices = add_rpc_servers(g, offload)?;
        let candidates = pick_devices(g, &offload.devices, &rpc_devices)?;
        // SAFETY: registered devices; names owned by ggml.
        let names: Vec<String> = candidates
            .iter()
            .map(|&d| unsafe { cstr(l.ggml_backend_dev_name(d)) })
            .collect();
        let mem_of = |d: sys::ggml_backend_dev_t| {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: out-pointers point at locals.
            unsafe { l.ggml_backend_dev_memory(d, &mut free, &mut total) };
            if let Some(limit) = spec_mem_limit {
                free = free.min(limit);
            }
            free
        };
        // Each device's share of the units (the layers, then the output layer).
        let split = &offload.tensor_split;
        if split.0.len() > candidates.len() {
            return Err(OffloadError::NoDevice(format!(
                "--tensor-split has {} shares, but there are {} offload devices ({})",
                split.0.len(),
                candidates.len(),
                names.join(", ")
            )));
        }
        let shares: Vec<f64> = if split.is_default() {
            candidates
                .iter()
                .map(|&d| mem_of(d).max(1) as f64)
                .collect()
        } else {
            (0..candidates.len())
                .map(|i| split.0.get(i).copied().unwrap_or(0.0) as f64)
                .collect()
        };
        let n_units = layers.len() + output.is_some() as usize;
        let unit_dev = super::assign_units(&shares, n_units);
        // The devices that get any unit, in order; unit j's index among them.
        let used: Vec<usize> = (0..candidates.len())
            .filter(|i| unit_dev.contains(i))
            .collect();
        let unit_at: Vec<usize> = unit_dev
            .iter()
            .map(|d| used.iter().position(|u| u == d).expect("used"))
            .collect();
        let layer_at = &unit_at[..layers.len()];
        let output_dev = if output.is_some() {
            unit_at[layers.len()]
        } else {
            used.len() - 1
        };
        let dev_of = |i: usize| candidates[used[i]];
        let name_of = |i: usize| names[used[i]].clone();

        // Flash attention where every device runs it at these layers' head sizes (the
        // device is asked only when the setting leaves it a say).
        let layer_specs = &spec.layers[first_layer..first_layer + layers.len()];
        let fa_fails = || {
            (0..used.len()).find(|&i| {
                let specs: Vec<LayerSpec> = layer_specs
                    .iter()
                    .zip(layer_at)
                    .filter(|(_, &at)| at == i)
                    .map(|(s, _)| s.clone())
                    .collect();
                // SAFETY: a registered device.
                !specs.is_empty() && !unsafe { device_runs_flash_attn(l, dev_of(i), cfg, &specs) }
            })
        };
        let flash_attn = match flash_attn_choice()? {
            Some(true) => match fa_fails() {
                Some(i) => {
                    return Err(OffloadError::Backend(format!(
                        "RLLAMA_OFFLOAD_FA asks for flash attention, but {} cannot run it \
                         at this model's head sizes",
                        name_of(i)
                    )))
                }
                None => true,
            },
            Some(false) => false,
            None => fa_fails().is_none(),
        };
        // The output matrix stays on the CPU where its device cannot multiply by it, as
        // llama.cpp keeps such a weight in host memory: Vulkan binds at most
        // maxStorageBufferRange bytes per tensor without 64-bit indexing (128 MiB on
        // lavapipe; gemma3's 262144 x 640 Q8_0 output matrix is 170 MiB).
        let mut output_on_cpu = None;
        let output = match output {
            Some((_, Weight::Mat { ty, n_in, n_out, bytes, .. }))
                // SAFETY: a registered device.
                if !unsafe { device_runs_product(l, dev_of(output_dev), gtype(ty), n_in, n_out) } =>
            {
                output_on_cpu = Some(format!(
                    "the output matrix ({ty}, {n_out} x {n_in}, {} MiB) stays on the CPU: \
                     {} cannot multiply by a tensor that large",
                    bytes.len() >> 20,
                    name_of(output_dev)
                ));
                None
            }
            o => o,
        };

        // Memory check before any allocation: what each device's layers need against what
        // it has free, naming how many layers would fit.
        let k_dim = cfg.n_head_kv * cfg.head_dim_k;
        let v_dim = cfg.n_head_kv * cfg.head_dim_v;
        let kv_per_layer = n_slots * (k_dim + v_dim) * 2;
        // `--n-cpu-moe N`: the expert stacks of layers below N stay in host memory (their
        // biases, small, go to the device with the rest of the layer).
        let on_host = |j: usize| {
            first_layer + j < offload.n_cpu_moe && matches!(layers[j].ffn, FfnKind::Moe { .. })
        };
        let layer_bytes: Vec<usize> = layers
            .iter()
            .enumerate()
            .map(|(j, w)| {
                let host = if on_host(j) { expert_bytes(w) } else { 0 };
                layer_weight_bytes(w) - host + kv_per_layer
            })
            .collect();
        let out_bytes = output
            .as_ref()
            .map_or(0, |(n, w)| n.len() * 4 + weight_bytes(w));
        // Keep room for the compute buffer (activations of one call).
        let reserve = 64 << 20;
        for i in 0..used.len() {
            let mine: Vec<usize> = (0..layers.len()).filter(|&j| layer_at[j] == i).collect();
            let has_out = output.is_some() && output_dev == i;
            let need: usize = mine.iter().map(|&j| layer_bytes[j]).sum::<usize>()
                + if has_out { out_bytes } else { 0 };
            let free = mem_of(dev_of(i));
            if need + reserve > free {
                let mut fit = 0;
                let mut used_b = reserve;
                for &j in mine.iter().rev() {
                    if used_b + layer_bytes[j] > free {
                        break;
                    }
                    used_b += layer_bytes[j];
                    fit += 1;
                }
                return Err(if used.len() == 1 {
                    OffloadError::OutOfMemory {
                        device: name_of(i),
                        need_mib: (need + reserve) >> 20,
                        free_mib: free >> 20,
                        layers: layers.len(),
                        output: has_out,
                        fit,
                    }
                } else {
                    OffloadError::ShareTooLarge {
                        device: name_of(i),
                        need_mib: (need + reserve) >> 20,
                        free_mib: free >> 20,
                        layers: mine.len(),
                        output: has_out,
                        fit,
                    }
                });
            }
        }

        let mut devs: Vec<Dev> = Vec::with_capacity(used.len());
        for i in 0..used.len() {
            let dev = dev_of(i);
            let name = name_of(i);
            // SAFETY: NULL params are accepted by every backend's init.
            let backend = unsafe { l.ggml_backend_dev_init(dev, std::ptr::null()) };
            if backend.is_null() {
                // SAFETY: the earlier devices' handles are live and unused.
                unsafe { free_devs(l, &mut devs) };
                return Err(OffloadError::Backend(format!(
                    "{name}: backend init failed"
                )));
            }
            set_threads(l, dev, backend, threads);
            let n_mine = layer_at.iter().filter(|&&at| at == i).count();
            let start = layer_at
                .iter()
                .position(|&at| at == i)
                .unwrap_or(layers.len());
            let ctxs = new_ctx(l, n_mine * 32 + 4).and_then(|w| match new_ctx(l, n_mine * 2 + 2) {
                Ok(kv) => Ok((w, kv)),
                Err(e) => {
                    // SAFETY: w is a live context with no tensors allocated.
                    unsafe { l.ggml_free(w) };
                    Err(e)
                }
            });
            let (w_ctx, kv_ctx) = match ctxs {
                Ok(c) => c,
                Err(e) => {
                    // SAFETY: the handles are live and unused.
                    unsafe {
                        l.ggml_backend_free(backend);
                        free_devs(l, &mut devs);
                    }
                    return Err(e);
                }
            };
            devs.push(Dev {
                dev,
                backend,
                name,
                w_ctx,
                w_buf: null_mut(),
                kv_ctx,
                kv_buf: null_mut(),
                weight_bytes: 0,
                kv_bytes: 0,
                layers: first_layer + start..first_layer + start + n_mine,
                output: output.is_some() && output_dev == i,
            });
        }
        let host_ctx = match new_ctx(l, layers.len() * 4 + 1) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: the handles are live and unused.
                unsafe { free_devs(l, &mut devs) };
                return Err(e);
            }
        };
        let uploads: std::cell::RefCell<Vec<(*mut ggml_tensor, *const u8, usize)>> =
            Default::default();
        // Whether the layer being mapped keeps its expert stacks in host memory, and the
        // context of the device it goes to.
        let experts_to_host = std::cell::Cell::new(false);
        let w_ctx_now = std::cell::Cell::new(devs[0].w_ctx);
        let new_w = |w: &Weight<'_>| -> *mut ggml_tensor {
            let w_ctx = w_ctx_now.get();
            // SAFETY: w_ctx and host_ctx are live no-alloc contexts sized for these tensors.
            unsafe {
                match w {
                    Weight::Mat {
                        ty,
                        n_in,
                        n_out,
                        n_expert,
                        bytes,
                    } => {
                        let t = if *n_expert > 1 {
                            l.ggml_new_tensor_3d(
                                if experts_to_host.get() {
                                    host_ctx
                                } else {
                                    w_ctx
                                },
                                gtype(*ty),
                                *n_in as i64,
                                *n_out as i64,
                                *n_expert as i64,
                            )
                        } else {
                            l.ggml_new_tensor_2d(w_ctx, gtype(*ty), *n_in as i64, *n_out as i64)
                        };
                        uploads.borrow_mut().push((t, bytes.as_ptr(), bytes.len()));
                        t
                    }
                    Weight::Vec(v) => {
                        let t = l.ggml_new_tensor_1d(
                            w_ctx,
                            sys::ggml_type_GGML_TYPE_F32,
                            v.len() as i64,
                        );
                        uploads
                            .borrow_mut()
                            .push((t, v.as_ptr().cast(), v.len() * 4));
                        t
                    }
                }
            }
        };
        let mut lw = Vec::with_capacity(layers.len());
        for (j, (w, ls)) in layers.iter().zip(layer_specs).enumerate() {
            let d = &devs[layer_at[j]];
            w_ctx_now.set(d.w_ctx);
            experts_to_host.set(on_host(j));
            let dw = w
                .map::<_, _, std::convert::Infallible>(&mut |m| Ok(new_w(m)), &mut |v| {
                    Ok(new_w(&Weight::Vec(v)))
                })
                .unwrap_or_else(|e| match e {});
            experts_to_host.set(false);
            let freq_factors = ls
                .attn
                .rope
                .as_ref()
                .and_then(|r| r.freq_factors.as_deref())
                .map(|f| new_w(&Weight::Vec(f)));
            // SAFETY: the device's kv_ctx is a live no-alloc context.
            let (k_cache, v_cache) = unsafe {
                (
                    l.ggml_new_tensor_2d(
                        d.kv_ctx,
                        sys::ggml_type_GGML_TYPE_F16,
                        k_dim as i64,
                        n_slots as i64,
                    ),
                    l.ggml_new_tensor_2d(
                        d.kv_ctx,
                        sys::ggml_type_GGML_TYPE_F16,
                        v_dim as i64,
                        n_slots as i64,
                    ),
                )
            };
            lw.push(DevLayer {
                w: dw,
                spec: ls.clone(),
                k_cache,
                v_cache,
                freq_factors,
            });
        }
        w_ctx_now.set(devs[output_dev].w_ctx);
        let out = output.as_ref().map(|(norm, w)| {
            let n = new_w(&Weight::Vec(norm));
            (n, new_w(w))
        });

        // SAFETY: contexts hold only tensor metadata; each backend allocates its data.
        let mut allocated = true;
        for d in &mut devs {
            unsafe {
                d.w_buf = l.ggml_backend_alloc_ctx_tensors(d.w_ctx, d.backend);
                d.kv_buf = l.ggml_backend_alloc_ctx_tensors(d.kv_ctx, d.backend);
            }
            // A device holding only the output layer has no KV cache (no tensors, no
            // buffer).
            let kv_needed = !d.layers.is_empty();
            allocated &= !d.w_buf.is_null() && (!d.kv_buf.is_null() || !kv_needed);
        }
        let n_host = (0..layers.len()).filter(|&j| on_host(j)).count();
        let host = match (n_host, allocated) {
            (0, _) | (_, false) => {
                // SAFETY: host_ctx holds no allocated tensor data.
                unsafe { l.ggml_free(host_ctx) };
                Ok(None)
            }
            // SAFETY: host_ctx is a live no-alloc context.
            _ => unsafe { host_experts(l, host_ctx, threads) }.map(|(buf, be)| {
                Some(HostExperts {
                    ctx: host_ctx,
                    buf,
                    backend: be,
                    layers: first_layer..first_layer + n_host,
                    // SAFETY: buf is live.
                    bytes: unsafe { l.ggml_backend_buffer_get_size(buf) },
                })
            }),
        };
        let host = match host {
            Ok(h) if allocated => h,
            r => {
                // SAFETY: the handles are live and unused.
                unsafe { free_devs(l, &mut devs) };
                r?;
                return Err(OffloadError::OutOfMemory {
                    device: names.join(","),
                    need_mib: layer_bytes.iter().sum::<usize>() >> 20,
                    free_mib: candidates.iter().map(|&d| mem_of(d)).sum::<usize>() >> 20,
                    layers: layers.len(),
                    output: out.is_some(),
                    fit: 0,
                });
            }
        };
        let uploads = uploads.into_inner();
        let total_uploads = uploads.len();
        for (i, (t, p, n)) in uploads.into_iter().enumerate() {
            // SAFETY: t was allocated with exactly n bytes (its type and shape); p points
            // at n readable bytes (the mapped file or a loaded vector).
            unsafe { l.ggml_backend_tensor_set(t, p.cast::<c_void>(), 0, n) };
            progress(i + 1, total_uploads);
        }
        for d in &mut devs {
            // SAFETY: the buffers are live.
            unsafe {
                if !d.kv_buf.is_null() {
                    l.ggml_backend_buffer_clear(d.kv_buf, 0);
                    d.kv_bytes = l.ggml_backend_buffer_get_size(d.kv_buf);
                }
                d.weight_bytes = l.ggml_backend_buffer_get_size(d.w_buf);
            }
        }
        // ggml's scheduler, where the graph spans backends, needs a CPU backend last: the
        // host experts' one, else one of its own.
        let mut sched_cpu = None;
        if host.is_none() && devs.len() > 1 {
            // SAFETY: an empty no-alloc context is freed at once; the backend is owned here.
            match unsafe { cpu_backend(l, threads) } {
                Some(b) => sched_cpu = Some(b),
                None => {
                    unsafe { free_devs(l, &mut devs) };
                    return Err(OffloadError::Backend(
                        "several offload devices need ggml's CPU backend for the scheduler, \
                         and it is not loaded"
                            .into(),
                    ));
                }
            }
        }
        let alloc = match host.as_ref().map(|h| h.backend).or(sched_cpu) {
            // SAFETY: the backend is live; its default buffer type outlives the allocator.
            None => Alloc::Device(unsafe {
                l.ggml_gallocr_new(l.ggml_backend_get_default_buffer_type(devs[0].backend))
            }),
            // The devices first, in order, the CPU last (the scheduler's order of
            // preference), and llama.cpp's default of letting a device take an op on host
            // weights for large batches (copying the weights up for it) where it says it
            // is worth it.
            // SAFETY: the backends are live and outlive the scheduler.
            Some(cpu) => Alloc::Sched(unsafe {
                let mut backends: Vec<sys::ggml_backend_t> =
                    devs.iter().map(|d| d.backend).collect();
                backends.push(cpu);
                l.ggml_backend_sched_new(
                    backends.as_mut_ptr(),
                    null_mut(),
                    backends.len() as i32,
                    GRAPH_SIZE,
                    false,
                    true,
                )
            }),
        };
        let meta_size = unsafe {
            l.ggml_tensor_overhead() * GRAPH_SIZE + l.ggml_graph_overhead_custom(GRAPH_SIZE, false)
        };
        let device = devs
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        Ok(DeviceLayers {
            g,
            weight_bytes: devs.iter().map(|d| d.weight_bytes).sum(),
            kv_bytes: devs.iter().map(|d| d.kv_bytes).sum(),
            devs,
            output_on_cpu,
            device,
            first_layer,
            layers: lw,
            output: out,
            output_dev,
            cfg: cfg.clone(),
            n_slots,
            flash_attn,
            host,
            sched_cpu,
            state: Mutex::new(State {
                alloc,
                meta: vec![0u8; meta_size],
                compute_bytes: 0,
                calls: 0,
                fail_at,
                graph: None,
                builds: 0,
                reuses: 0,
            }),
        })
    }
    /// Number of offloaded layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether the output layer runs here too (then `forward` returns logits).
    pub fn has_output(&self) -> bool {
        self.output.is_some()
    }

    /// Why the output layer, asked for, runs on the CPU instead (the device cannot
    /// multiply by a matrix that large).
    pub fn output_on_cpu(&self) -> Option<&str> {
        self.output_on_cpu.as_deref()
    }

    /// KV slots the device cache holds.
    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// Whether attention runs as ggml's fused flash attention (else as two products).
    pub fn flash_attn(&self) -> bool {
        self.flash_attn
    }
    /// `--n-cpu-moe`: the layers whose experts stay in host memory, and their bytes.
    pub fn experts_on_cpu(&self) -> Option<(std::ops::Range<usize>, usize)> {
        self.host.as_ref().map(|h| (h.layers.clone(), h.bytes))
    }

    /// Largest compute buffer used so far.
    pub fn compute_bytes(&self) -> usize {
        self.state.lock().map(|s| s.compute_bytes).unwrap_or(0)
    }

    /// ggml's name of the device.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Each device's name, its layers (global indices) and whether it holds the output
    /// layer, in device order.
    pub fn split(&self) -> Vec<(String, std::ops::Range<usize>, bool)> {
        self.devs
            .iter()
            .map(|d| (d.name.clone(), d.layers.clone(), d.output))
            .collect()
    }

    /// Device memory in use (all devices together): weights, KV cache, the largest
    /// compute buffer so far.
    pub fn memory(&self) -> super::DeviceMemory {
        super::DeviceMemory {
            weights: self.weight_bytes,
            kv_cache: self.kv_bytes,
            compute: self.compute_bytes(),
        }
    }

    /// One line for logs: where, how many layers, memory.
    pub fn summary(&self) -> String {
        let split = if self.devs.len() > 1 {
            let parts: Vec<String> = self
                .devs
                .iter()
                .map(|d| {
                    format!(
                        "{}: {}{} ({} MiB)",
                        d.name,
                        match d.layers.len() {
                            0 => "no layers".to_string(),
                            1 => format!("layer {}", d.layers.start),
                            _ => format!("layers {}..{}", d.layers.start, d.layers.end),
                        },
                        if d.output { " + output" } else { "" },
                        (d.weight_bytes + d.kv_bytes) >> 20
                    )
                })
                .collect();
            format!("; split {}", parts.join(", "))
        } else {
            String::new()
        };
        format!(
            "{} layers{} on {} ({}): weights {} MiB, KV cache {} MiB ({} slots){split}",
            self.layers.len(),
            if self.output.is_some() {
                " + output"
            } else {
                ""
            },
            self.device,
            self.backend_name(),
            self.weight_bytes >> 20,
            self.kv_bytes >> 20,
            self.n_slots
        ) + &self
            .output_on_cpu
            .as_ref()
            .map_or(String::new(), |why| format!("; {why}"))
            + &self.host.as_ref().map_or(String::new(), |h| {
                format!(
                    "; experts of layers {}..{} on the CPU (--n-cpu-moe, {} MiB)",
                    h.layers.start,
                    h.layers.end,
                    h.bytes >> 20
                )
            })
            + if self.flash_attn {
                "; flash attention"
            } else {
                "; attention as two products"
            }
            + if self.backend_name().contains("CUDA") {
                if super::cuda_graphs_policy(true) {
                    "; CUDA graphs on"
                } else {
                    "; CUDA graphs off (RLLAMA_CUDA_GRAPHS=1 turns them on)"
                }
            } else {
                ""
            }
    }

    /// The backends' names, comma-separated.
    fn backend_name(&self) -> String {
        let names: Vec<String> = self
            .devs
            .iter()
            // SAFETY: the backend is live; its name is owned by ggml.
            .map(|d| unsafe { cstr(self.g.raw().ggml_backend_name(d.backend)) })
            .collect();
        names.join(",")
    }

    /// Runs the offloaded layers for one batch and writes, for `b.out_rows`, either the
    /// hidden state after the last layer (`n_out x n_embd`) or, with the output layer
    /// here, the logits (`n_out x n_vocab`) into `out`.
    pub fn forward(&self, b: &DeviceBatch<'_>, out: &mut Vec<f32>) -> Result<(), OffloadError> {
        let c = &self.cfg;
        let l = self.g.raw();
        let d = c.n_embd;
        let n_tok = b.pos.len();
        let n_out = b.out_rows.len();
        if n_tok == 0 || n_out == 0 {
            out.clear();
            return Ok(());
        }
        let mut st = self
            .state
            .lock()
            .map_err(|_| OffloadError::Backend("device state poisoned".into()))?;
        st.calls += 1;
        if st.fail_at.is_some_and(|n| st.calls >= n) {
            return Err(OffloadError::Backend(format!(
                "{}: device lost (RLLAMA_OFFLOAD_FAIL_AT={})",
                self.device,
                st.fail_at.unwrap_or(0)
            )));
        }

        // The slots the batch attends over: every position of each sequence of the batch,
        // padded to a multiple of KV_PAD with masked entries so that consecutive decode
        // steps keep one shape and reuse their graph.
        let mut kv_idx: Vec<i32> = Vec::new();
        let mut kv_seq: Vec<(usize, usize)> = Vec::new(); // (sequence, position)
        for (s, slots) in b.seq_slots.iter().enumerate() {
            if !b.seq.contains(&s) {
                continue;
            }
            for (p, &slot) in slots.iter().enumerate() {
                if slot >= self.n_slots {
                    return Err(OffloadError::Backend(format!(
                        "KV slot {slot} is beyond the device cache's {} slots",
                        self.n_slots
                    )));
                }
                kv_idx.push(slot as i32);
                kv_seq.push((s, p));
            }
        }
        let n_kv = kv_idx.len().div_ceil(KV_PAD) * KV_PAD;
        let pad_slot = kv_idx.first().copied().unwrap_or(0);
        kv_idx.resize(n_kv, pad_slot);
        kv_seq.resize(n_kv, (usize::MAX, 0));
        let mask_for = |window: usize| -> Vec<f32> {
            let mut m = vec![f32::NEG_INFINITY; n_kv * n_tok];
            for t in 0..n_tok {
                let (s, pos) = (b.seq[t], b.pos[t]);
                let first = if window > 0 {
                    (pos + 1).saturating_sub(window)
                } else {
                    0
                };
                for (j, &(ks, kp)) in kv_seq.iter().enumerate() {
                    if ks == s && kp <= pos && kp >= first {
                        m[t * n_kv + j] = 0.0;
                    }
                }
            }
            m
        };
        let windows = self.windows();
        let masks: Vec<Vec<f32>> = windows.iter().map(|&w| mask_for(w)).collect();
        let slot_of: Vec<i64> = (0..n_tok)
            .map(|t| b.seq_slots[b.seq[t]][b.pos[t]] as i64)
            .collect();
        let pos: Vec<i32> = b.pos.iter().map(|&p| p as i32).collect();
        let rows: Vec<i32> = b.out_rows.iter().map(|&r| r as i32).collect();

        let key = (n_tok, n_kv, n_out);
        // SAFETY: all ggml calls below act on the graph context (backed by st.meta), the
        // device's weight and KV tensors, and input buffers that outlive the calls.
        unsafe {
            if st.graph.as_ref().map(|g| g.key) != Some(key) {
                if let Alloc::Sched(s) = st.alloc {
                    // The scheduler refers to the old graph's nodes until reset.
                    l.ggml_backend_sched_reset(s);
                }
                if let Some(old) = st.graph.take() {
                    l.ggml_free(old.ctx);
                }
                let scheduled = matches!(st.alloc, Alloc::Sched(_));
                let gr = self.build(&mut st.meta, key, scheduled)?;
                let (ok, bytes) = match st.alloc {
                    Alloc::Device(a) => (
                        l.ggml_gallocr_alloc_graph(a, gr.gf),
                        l.ggml_gallocr_get_buffer_size(a, 0),
                    ),
                    Alloc::Sched(s) => (
                        l.ggml_backend_sched_alloc_graph(s, gr.gf),
                        self.devs
                            .iter()
                            .map(|d| l.ggml_backend_sched_get_buffer_size(s, d.backend))
                            .sum(),
                    ),
                };
                if !ok {
                    l.ggml_free(gr.ctx);
                    return Err(OffloadError::Backend(format!(
                        "{}: out of device memory for the compute buffer ({n_tok} tokens, {n_kv} KV slots)",
                        self.device
                    )));
                }
                st.compute_bytes = st.compute_bytes.max(bytes);
                st.builds += 1;
                st.graph = Some(gr);
            } else {
                st.reuses += 1;
            }
            let gr = st.graph.as_ref().expect("built above");
            set(l, gr.x, b.x.as_ptr(), n_tok * d);
            set(l, gr.pos, pos.as_ptr(), n_tok);
            set(l, gr.slot, slot_of.as_ptr(), n_tok);
            set(l, gr.kv, kv_idx.as_ptr(), n_kv);
            for (&t, m) in gr.masks.iter().zip(&masks) {
                if self.flash_attn {
                    let h: Vec<u16> = m.iter().map(|&v| quant::f16::f32_to_f16(v)).collect();
                    set(l, t, h.as_ptr(), h.len());
                } else {
                    set(l, t, m.as_ptr(), m.len());
                }
            }
            set(l, gr.rows, rows.as_ptr(), n_out);
            let gf = gr.gf;
            let status = match st.alloc {
                Alloc::Device(_) => l.ggml_backend_graph_compute(self.devs[0].backend, gf),
                Alloc::Sched(s) => l.ggml_backend_sched_graph_compute(s, gf),
            };
            if status != sys::ggml_status_GGML_STATUS_SUCCESS {
                return Err(OffloadError::Backend(format!(
                    "{}: graph compute failed (status {status})",
                    self.device
                )));
            }
            let width = if self.output.is_some() { c.n_vocab } else { d };
            out.resize(n_out * width, 0.0);
            let mut r0 = 0;
            for &(t, n) in &gr.res {
                let dst = out[r0 * width..(r0 + n) * width].as_mut_ptr();
                l.ggml_backend_tensor_get(t, dst.cast(), 0, n * width * 4);
                r0 += n;
            }
        }
        Ok(())
    }

    /// (graphs built, graphs reused) so far: decode steps of one shape reuse one graph.
    pub fn graph_stats(&self) -> (usize, usize) {
        self.state.lock().map_or((0, 0), |s| (s.builds, s.reuses))
    }

    /// Builds the graph of one shape (tokens, padded KV slots, output rows) in `meta`.
    unsafe fn build(
        &self,
        meta: &mut [u8],
        key: (usize, usize, usize),
        scheduled: bool,
    ) -> Result<Graph, OffloadError> {
        let (n_tok, n_kv, n_out) = key;
        let c = &self.cfg;
        let l = self.g.raw();
        let ctx = l.ggml_init(sys::ggml_init_params {
            mem_size: meta.len(),
            mem_buffer: meta.as_mut_ptr().cast(),
            no_alloc: true,
        });
        if ctx.is_null() {
            return Err(OffloadError::Backend("ggml_init failed".into()));
        }
        let gb = Gb { l, ctx };
        let x = gb.input(sys::ggml_type_GGML_TYPE_F32, &[c.n_embd, n_tok]);
        let pos = gb.input(sys::ggml_type_GGML_TYPE_I32, &[n_tok]);
        let slot = gb.input(sys::ggml_type_GGML_TYPE_I64, &[n_tok]);
        let kv = gb.input(sys::ggml_type_GGML_TYPE_I32, &[n_kv]);
        // Flash attention takes its mask in f16.
        let mask_ty = if self.flash_attn {
            sys::ggml_type_GGML_TYPE_F16
        } else {
            sys::ggml_type_GGML_TYPE_F32
        };
        let windows = self.windows();
        let masks: Vec<*mut ggml_tensor> = windows
            .iter()
            .map(|_| gb.input(mask_ty, &[n_kv, n_tok]))
            .collect();
        let rows = gb.input(sys::ggml_type_GGML_TYPE_I32, &[n_out]);
        let gf = l.ggml_new_graph_custom(ctx, GRAPH_SIZE, false);
        let mut h = x;
        for w in &self.layers {
            let at = windows
                .iter()
                .position(|&v| v == w.spec.attn.window)
                .expect("every layer's window has a mask");
            h = self.layer(&gb, gf, w, h, pos, slot, kv, masks[at], n_tok, n_kv);
        }
        let mut res = vec![(l.ggml_get_rows(ctx, h, rows), n_out)];
        if let Some((norm, w)) = self.output {
            let normed = l.ggml_mul(ctx, l.ggml_rms_norm(ctx, res[0].0, c.rms_eps), norm);
            res = self.output_products(&gb, w, normed, n_out);
        }
        for &(t, _) in &res {
            l.ggml_set_output(t);
            l.ggml_build_forward_expand(gf, t);
        }
        // A node the device cannot run would be computed anyway by a direct graph compute,
        // into garbage (ggml's scheduler moves it to the CPU, but only `--n-cpu-moe` and a
        // split over several devices run one): refuse the graph with the node named instead.
        let n_check = if scheduled {
            0
        } else {
            l.ggml_graph_n_nodes(gf)
        };
        for i in 0..n_check {
            let node = l.ggml_graph_node(gf, i);
            if !l.ggml_backend_dev_supports_op(self.devs[0].dev, node) {
                let t = &*node;
                let msg = format!(
                    "{}: the device cannot run {} on {} ({}x{}x{}x{}, {} bytes) for a batch of \
                     {n_tok} tokens and {n_kv} KV slots",
                    self.device,
                    cstr(l.ggml_op_desc(node)),
                    std::ffi::CStr::from_ptr(t.name.as_ptr()).to_string_lossy(),
                    t.ne[0],
                    t.ne[1],
                    t.ne[2],
                    t.ne[3],
                    l.ggml_nbytes(node),
                );
                l.ggml_free(ctx);
                return Err(OffloadError::Backend(msg));
            }
        }
        Ok(Graph {
            key,
            ctx,
            gf,
            x,
            pos,
            slot,
            kv,
            masks,
            rows,
            res,
        })
    }

    /// The distinct attention windows of the offloaded layers, in first-seen order.
    fn windows(&self) -> Vec<usize> {
        let mut w: Vec<usize> = Vec::new();
        for l in &self.layers {
            if !w.contains(&l.spec.attn.window) {
                w.push(l.spec.attn.window);
            }
        }
        w
    }

    /// The output matrix times the normed rows, as few products as the device can run:
    /// all rows in one unless the device refuses a result that large (Vulkan binds at most
    /// `maxStorageBufferRange` bytes, 128 MiB on lavapipe, where 256 rows of gemma3's
    /// 262144 logits take 256 MiB), then halved until it accepts each piece.
    unsafe fn output_products(
        &self,
        gb: &Gb<'_>,
        w: *mut ggml_tensor,
        normed: *mut ggml_tensor,
        n_out: usize,
    ) -> Vec<(*mut ggml_tensor, usize)> {
        let (l, ctx) = (gb.l, gb.ctx);
        let d = self.cfg.n_embd;
        let stride = (*normed).nb[1];
        let piece = |r0: usize, n: usize| {
            let v = if n == n_out {
                normed
            } else {
                l.ggml_view_2d(ctx, normed, d as i64, n as i64, stride, r0 * stride)
            };
            l.ggml_mul_mat(ctx, w, v)
        };
        let mut n = n_out;
        let mut first = piece(0, n);
        let dev = self.devs[self.output_dev].dev;
        while n > 1 && !l.ggml_backend_dev_supports_op(dev, first) {
            n = n.div_ceil(2);
            first = piece(0, n);
        }
        let mut out = vec![(first, n)];
        let mut r0 = n;
        while r0 < n_out {
            let m = n.min(n_out - r0);
            out.push((piece(r0, m), m));
            r0 += m;
        }
        out
    }

    /// One layer's nodes, step by step as its declaration says. Shapes follow ggml's
    /// order: `[n_embd, n_tok]` for hidden states.
    #[allow(clippy::too_many_arguments)]
    unsafe fn layer(
        &self,
        gb: &Gb<'_>,
        gf: *mut sys::ggml_cgraph,
        dl: &DevLayer,
        x: *mut ggml_tensor,
        pos: *mut ggml_tensor,
        slot: *mut ggml_tensor,
        kv: *mut ggml_tensor,
        mask: *mut ggml_tensor,
        n_tok: usize,
        n_kv: usize,
    ) -> *mut ggml_tensor {
        let c = &self.cfg;
        let (w, a) = (&dl.w, &dl.spec.attn);
        let (l, ctx) = (gb.l, gb.ctx);
        let (hk, hv) = (c.head_dim_k as i64, c.head_dim_v as i64);
        let (nh, nkv) = (c.n_head as i64, c.n_head_kv as i64);
        let (nt, nk) = (n_tok as i64, n_kv as i64);
        let norm = |t: *mut ggml_tensor, w: *mut ggml_tensor| {
            l.ggml_mul(ctx, l.ggml_rms_norm(ctx, t, c.rms_eps), w)
        };
        let bias = |t: *mut ggml_tensor, b: Option<*mut ggml_tensor>| match b {
            Some(b) => l.ggml_add(ctx, t, b),
            None => t,
        };

        let cur = norm(x, w.attn_norm);
        let (q, k, v) = match &w.qkv {
            Qkv::Split { q, k, v } => (
                l.ggml_mul_mat(ctx, *q, cur),
                l.ggml_mul_mat(ctx, *k, cur),
                l.ggml_mul_mat(ctx, *v, cur),
            ),
            Qkv::Fused(m) => {
                let qkv = l.ggml_mul_mat(ctx, *m, cur);
                let nb1 = (*qkv).nb[1];
                let part = |off: i64, n: i64| {
                    l.ggml_cont(
                        ctx,
                        l.ggml_view_2d(ctx, qkv, n, nt, nb1, (off * 4) as usize),
                    )
                };
                (
                    part(0, hk * nh),
                    part(hk * nh, hk * nkv),
                    part(hk * (nh + nkv), hv * nkv),
                )
            }
        };
        let q = bias(q, w.b_qkv[0]);
        let k = bias(k, w.b_qkv[1]);
        let v = bias(v, w.b_qkv[2]);
        let mut q = l.ggml_reshape_3d(ctx, q, hk, nh, nt);
        let mut k = l.ggml_reshape_3d(ctx, k, hk, nkv, nt);
        if let Some(qn) = w.q_norm {
            q = norm(q, qn);
        }
        if let Some(kn) = w.k_norm {
            k = norm(k, kn);
        }
        if let Some(r) = &a.rope {
            let mode = match r.style {
                RopeStyle::Normal => 0,
                RopeStyle::Neox => 2,
            };
            let ff = dl.freq_factors.unwrap_or(null_mut());
            let [beta_fast, beta_slow] = c.yarn_beta;
            let rope = |t| {
                l.ggml_rope_ext(
                    ctx,
                    t,
                    pos,
                    ff,
                    r.n_dims as i32,
                    mode,
                    c.n_ctx_orig as i32,
                    r.freq_base,
                    r.freq_scale,
                    r.ext_factor,
                    r.attn_factor,
                    beta_fast,
                    beta_slow,
                )
            };
            q = rope(q);
            k = rope(k);
        }
        if let Some(sc) = a.q_scale {
            q = l.ggml_scale(ctx, q, sc);
        }

        // Write this batch's K and V rows at their slots, then gather the batch's slots.
        let k_dim = hk * nkv;
        let kc = l.ggml_set_rows(ctx, dl.k_cache, l.ggml_reshape_2d(ctx, k, k_dim, nt), slot);
        let vc = l.ggml_set_rows(ctx, dl.v_cache, v, slot);
        l.ggml_build_forward_expand(gf, kc);
        l.ggml_build_forward_expand(gf, vc);
        let kg = l.ggml_reshape_3d(ctx, l.ggml_get_rows(ctx, kc, kv), hk, nkv, nk);
        let vg = l.ggml_reshape_3d(ctx, l.ggml_get_rows(ctx, vc, kv), hv, nkv, nk);
        // The gathered rows come back as f32; cast to f16 (lossless: the cache is f16) so
        // the products round the query and the probabilities to f16 as llama.cpp's (and
        // our CPU path's) f16 attention does.
        let f16 = sys::ggml_type_GGML_TYPE_F16;
        let qp = l.ggml_permute(ctx, q, 0, 2, 1, 3); // [hk, n_tok, n_head]
        let o = if self.flash_attn {
            // ggml's fused attention, as llama.cpp runs it by default where the device has
            // it (flash attention `auto`), with f32 accumulation as llama.cpp asks.
            let kp = l.ggml_permute(ctx, l.ggml_cast(ctx, kg, f16), 0, 2, 1, 3); // [hk, n_kv, n_head_kv]
            let vp = l.ggml_permute(ctx, l.ggml_cast(ctx, vg, f16), 0, 2, 1, 3); // [hv, n_kv, n_head_kv]
            let o = l.ggml_flash_attn_ext(
                ctx,
                qp,
                kp,
                vp,
                mask,
                a.kq_scale,
                0.0,
                a.softcap.unwrap_or(0.0),
            ); // [hv, n_head, n_tok]
            if let Some(sk) = w.sinks {
                l.ggml_flash_attn_ext_add_sinks(o, sk);
            }
            l.ggml_prec_set_acc(o, sys::ggml_prec_GGML_PREC_F32);
            o
        } else {
            // The scores need f32 accumulation, as llama.cpp asks for them: a device with
            // f16 arithmetic (ggml-vulkan) otherwise sums them in f16. ggml's CPU backend
            // always sums in f32, so this changes nothing there.
            let kp = l.ggml_cast(ctx, l.ggml_permute(ctx, kg, 0, 2, 1, 3), f16); // [hk, n_kv, n_head_kv]
            let mut kq = l.ggml_mul_mat(ctx, kp, qp); // [n_kv, n_tok, n_head]
            l.ggml_prec_set_acc(kq, sys::ggml_prec_GGML_PREC_F32);
            if let Some(cap) = a.softcap {
                kq = l.ggml_scale(ctx, kq, 1.0 / cap);
                kq = l.ggml_tanh(ctx, kq);
                kq = l.ggml_scale(ctx, kq, cap);
            }
            let kq = l.ggml_soft_max_ext(ctx, kq, mask, a.kq_scale, 0.0);
            if let Some(sk) = w.sinks {
                l.ggml_soft_max_add_sinks(kq, sk);
            }
            let vt = l.ggml_cast(ctx, l.ggml_permute(ctx, vg, 1, 2, 0, 3), f16); // [n_kv, hv, n_head_kv]
            let kqv = l.ggml_mul_mat(ctx, vt, kq); // [hv, n_tok, n_head]
            l.ggml_cont(ctx, l.ggml_permute(ctx, kqv, 0, 2, 1, 3)) // [hv, n_head, n_tok]
        };
        let o = l.ggml_reshape_2d(ctx, o, hv * nh, nt);
        let mut o = bias(l.ggml_mul_mat(ctx, w.wo, o), w.b_o);
        if let Some(pn) = w.post_attn_norm {
            o = norm(o, pn);
        }
        let x = l.ggml_add(ctx, x, o);

        let cur = norm(x, w.ffn_norm);
        let mut o = match (&w.ffn, &dl.spec.ffn) {
            (FfnKind::Dense(f), FfnSpec::Dense { n_ff, act }) => {
                let (g, u) = match &f.gate_up {
                    GateUp::Split { gate, up } => (
                        l.ggml_mul_mat(ctx, *gate, cur),
                        l.ggml_mul_mat(ctx, *up, cur),
                    ),
                    GateUp::Fused(m) => {
                        let gu = l.ggml_mul_mat(ctx, *m, cur);
                        let nb1 = (*gu).nb[1];
                        let nf = *n_ff as i64;
                        (
                            l.ggml_cont(ctx, l.ggml_view_2d(ctx, gu, nf, nt, nb1, 0)),
                            l.ggml_cont(
                                ctx,
                                l.ggml_view_2d(ctx, gu, nf, nt, nb1, (nf * 4) as usize),
                            ),
                        )
                    }
                };
                let g = bias(g, f.b_gate);
                let u = bias(u, f.b_up);
                let act = glu(l, ctx, *act, g, u);
                bias(l.ggml_mul_mat(ctx, f.down, act), f.b_down)
            }
            (
                FfnKind::Moe {
                    router,
                    router_b,
                    experts,
                },
                FfnSpec::Moe(m),
            ) => {
                let (ne, nu, nf) = (m.n_expert as i64, m.n_used as i64, m.n_ff as i64);
                let d = c.n_embd as i64;
                let logits = bias(l.ggml_mul_mat(ctx, *router, cur), *router_b); // [ne, nt]
                let probs = match m.gating {
                    Gating::Softmax => l.ggml_soft_max(ctx, logits),
                    Gating::SoftmaxOfTopK => logits,
                };
                let sel = l.ggml_argsort_top_k(ctx, probs, nu as i32); // [nu, nt]
                let mut wts = l.ggml_get_rows(ctx, l.ggml_reshape_3d(ctx, probs, 1, ne, nt), sel); // [1, nu, nt]
                if m.gating == Gating::SoftmaxOfTopK {
                    let w2 = l.ggml_soft_max(ctx, l.ggml_reshape_2d(ctx, wts, nu, nt));
                    wts = l.ggml_reshape_3d(ctx, w2, 1, nu, nt);
                }
                if m.norm_weights {
                    let w2 = l.ggml_reshape_2d(ctx, wts, nu, nt);
                    let sum =
                        l.ggml_clamp(ctx, l.ggml_sum_rows(ctx, w2), 6.103_515_6e-5, f32::INFINITY);
                    wts = l.ggml_reshape_3d(ctx, l.ggml_div(ctx, w2, sum), 1, nu, nt);
                }
                if m.weight_scale != 0.0 && m.weight_scale != 1.0 {
                    wts = l.ggml_scale(ctx, wts, m.weight_scale);
                }
                let cur3 = l.ggml_reshape_3d(ctx, cur, d, 1, nt);
                let FfnW {
                    gate_up,
                    down,
                    b_gate,
                    b_up,
                    b_down,
                } = experts;
                let GateUp::Split { gate, up } = gate_up else {
                    unreachable!("experts are bound as separate gate and up stacks")
                };
                let add_id = |t: *mut ggml_tensor, b: Option<*mut ggml_tensor>, n: i64| match b {
                    Some(b) => l.ggml_add_id(ctx, t, l.ggml_reshape_2d(ctx, b, n, ne), sel),
                    None => t,
                };
                let u = add_id(l.ggml_mul_mat_id(ctx, *up, cur3, sel), *b_up, nf);
                let g = add_id(l.ggml_mul_mat_id(ctx, *gate, cur3, sel), *b_gate, nf);
                let act = glu(l, ctx, m.act, g, u); // [nf, nu, nt]
                let dn = add_id(l.ggml_mul_mat_id(ctx, *down, act, sel), *b_down, d); // [d, nu, nt]
                let dn = l.ggml_mul(ctx, dn, wts);
                let mut out = null_mut();
                for i in 0..nu {
                    let part =
                        l.ggml_view_2d(ctx, dn, d, nt, (*dn).nb[2], i as usize * (*dn).nb[1]);
                    out = if i == 0 {
                        part
                    } else {
                        l.ggml_add(ctx, out, part)
                    };
                }
                if nu == 1 {
                    out = l.ggml_cont(ctx, out);
                }
                out
            }
            _ => unreachable!("bound from the same declaration"),
        };
        if let Some(pn) = w.post_ffn_norm {
            o = norm(o, pn);
        }
        l.ggml_add(ctx, x, o)
    }
}

/// The gated activation `act(gate, up)` as ggml's op.
unsafe fn glu(
    l: &GgmlLib,
    ctx: *mut ggml_context,
    act: Act,
    g: *mut ggml_tensor,
    u: *mut ggml_tensor,
) -> *mut ggml_tensor {
    match act {
        Act::Silu => l.ggml_swiglu_split(ctx, g, u),
        Act::Gelu => l.ggml_geglu_split(ctx, g, u),
        Act::SwigluOai { alpha, limit } => l.ggml_swiglu_oai(ctx, g, u, alpha, limit),
    }
}

impl Drop for DeviceLayers {
    fn drop(&mut self) {
        let l = self.g.raw();
        // SAFETY: each object was created in `new` and is freed once, allocator first.
        unsafe {
            if let Ok(st) = self.state.get_mut() {
                match st.alloc {
                    Alloc::Device(a) => l.ggml_gallocr_free(a),
                    Alloc::Sched(s) => l.ggml_backend_sched_free(s),
                }
                if let Some(g) = st.graph.take() {
                    l.ggml_free(g.ctx);
                }
            }
            if let Some(h) = self.host.take() {
                l.ggml_backend_buffer_free(h.buf);
                l.ggml_free(h.ctx);
                l.ggml_backend_free(h.backend);
            }
            free_devs(l, &mut self.devs);
            if let Some(b) = self.sched_cpu.take() {
                l.ggml_backend_free(b);
            }
        }
    }
}

/// A per-call graph context.
struct Gb<'a> {
    l: &'a GgmlLib,
    ctx: *mut ggml_context,
}

impl Gb<'_> {
    unsafe fn input(&self, ty: sys::ggml_type, shape: &[usize]) -> *mut ggml_tensor {
        let t = match shape {
            [a] => self.l.ggml_new_tensor_1d(self.ctx, ty, *a as i64),
            [a, b] => self
                .l
                .ggml_new_tensor_2d(self.ctx, ty, *a as i64, *b as i64),
            _ => unreachable!("inputs are 1-D or 2-D"),
        };
        self.l.ggml_set_input(t);
        t
    }
}

/// Copies `n` elements into an allocated tensor.
unsafe fn set<T>(l: &GgmlLib, t: *mut ggml_tensor, p: *const T, n: usize) {
    l.ggml_backend_tensor_set(t, p.cast(), 0, n * std::mem::size_of::<T>());
}

fn new_ctx(l: &GgmlLib, n_tensors: usize) -> Result<*mut ggml_context, OffloadError> {
    // SAFETY: a no-alloc context of this size holds n_tensors tensor headers.
    let ctx = unsafe {
        l.ggml_init(sys::ggml_init_params {
            mem_size: l.ggml_tensor_overhead() * n_tensors,
            mem_buffer: null_mut(),
            no_alloc: true,
        })
    };
    if ctx.is_null() {
        Err(OffloadError::Backend("ggml_init failed".into()))
    } else {
        Ok(ctx)
    }
}

/// `RLLAMA_OFFLOAD_FA`: `1`/`on` or `0`/`off` forces flash attention on the device on or
/// off; unset or `auto`, it is on where the device runs it (llama.cpp's `-fa auto`).
fn flash_attn_choice() -> Result<Option<bool>, OffloadError> {
    match crate::options::Env::get().offload_fa.as_deref() {
        None | Some("auto") | Some("") => Ok(None),
        Some("1") | Some("on") => Ok(Some(true)),
        Some("0") | Some("off") => Ok(Some(false)),
        Some(v) => Err(OffloadError::Backend(format!(
            "RLLAMA_OFFLOAD_FA={v}: expected on, off or auto"
        ))),
    }
}

/// Whether `dev` runs flash attention at the model's head sizes, for one token and for a
/// batch, with the f16 K/V views and mask our graph gives it (metadata-only tensors).
unsafe fn device_runs_flash_attn(
    l: &GgmlLib,
    dev: sys::ggml_backend_dev_t,
    cfg: &Config,
    layers: &[LayerSpec],
) -> bool {
    let Ok(ctx) = new_ctx(l, 24) else {
        return false;
    };
    let softcap = layers.iter().find_map(|s| s.attn.softcap).unwrap_or(0.0);
    let sinks = layers.iter().any(|s| s.attn.sinks);
    let (hk, hv) = (cfg.head_dim_k as i64, cfg.head_dim_v as i64);
    let (nh, nkv, n_kv) = (cfg.n_head as i64, cfg.n_head_kv as i64, KV_PAD as i64);
    let (f16, f32) = (sys::ggml_type_GGML_TYPE_F16, sys::ggml_type_GGML_TYPE_F32);
    let ok = [1, 256].iter().all(|&n_tok| {
        let q = l.ggml_new_tensor_3d(ctx, f32, hk, nh, n_tok);
        let k = l.ggml_new_tensor_3d(ctx, f16, hk, nkv, n_kv);
        let v = l.ggml_new_tensor_3d(ctx, f16, hv, nkv, n_kv);
        let mask = l.ggml_new_tensor_2d(ctx, f16, n_kv, n_tok);
        let o = l.ggml_flash_attn_ext(
            ctx,
            l.ggml_permute(ctx, q, 0, 2, 1, 3),
            l.ggml_permute(ctx, k, 0, 2, 1, 3),
            l.ggml_permute(ctx, v, 0, 2, 1, 3),
            mask,
            1.0,
            0.0,
            softcap,
        );
        if sinks {
            l.ggml_flash_attn_ext_add_sinks(o, l.ggml_new_tensor_1d(ctx, f32, nh));
        }
        l.ggml_prec_set_acc(o, sys::ggml_prec_GGML_PREC_F32);
        l.ggml_backend_dev_supports_op(dev, o)
    });
    l.ggml_free(ctx);
    ok
}

/// Whether `dev` can multiply by a `ty` matrix of `n_out` rows of `n_in` (asked of the
/// device with metadata-only tensors; nothing is allocated).
unsafe fn device_runs_product(
    l: &GgmlLib,
    dev: sys::ggml_backend_dev_t,
    ty: sys::ggml_type,
    n_in: usize,
    n_out: usize,
) -> bool {
    let Ok(ctx) = new_ctx(l, 3) else {
        return false;
    };
    let w = l.ggml_new_tensor_2d(ctx, ty, n_in as i64, n_out as i64);
    let x = l.ggml_new_tensor_2d(ctx, sys::ggml_type_GGML_TYPE_F32, n_in as i64, 1);
    let ok = l.ggml_backend_dev_supports_op(dev, l.ggml_mul_mat(ctx, w, x));
    l.ggml_free(ctx);
    ok
}

fn weight_bytes(w: &Weight<'_>) -> usize {
    match w {
        Weight::Mat { bytes, .. } => bytes.len(),
        Weight::Vec(v) => v.len() * 4,
    }
}

fn layer_weight_bytes(w: &LayerW<Weight<'_>, &[f32]>) -> usize {
    let n = std::cell::Cell::new(0);
    w.map::<_, _, std::convert::Infallible>(
        &mut |m| {
            n.set(n.get() + weight_bytes(m));
            Ok(())
        },
        &mut |v| {
            n.set(n.get() + v.len() * 4);
            Ok(())
        },
    )
    .unwrap_or_else(|e| match e {});
    n.get()
}

/// Registers `--rpc` servers' devices with ggml; returns their names, in the order of
/// the servers.
fn add_rpc_servers(g: &Ggml, o: &super::OffloadSpec) -> Result<Vec<String>, OffloadError> {
    let mut names = Vec::new();
    for ep in &o.rpc {
        let devices = g
            .add_rpc_server(ep, o.rpc_allow_public)
            .map_err(OffloadError::NoDevice)?;
        names.extend(devices.into_iter().map(|d| d.name));
    }
    Ok(names)
}

/// The devices the layers go to, in order: those named (`--device A,B`; `CPU` is ggml's
/// CPU backend, the stand-in device of the tests, and only alone), else llama.cpp's
/// default: the RPC servers' devices first (fewer activations cross the network), then
/// every GPU, else every integrated GPU, else the first accelerator.
fn pick_devices(
    g: &Ggml,
    named: &[String],
    rpc: &[String],
) -> Result<Vec<sys::ggml_backend_dev_t>, OffloadError> {
    let l = g.raw();
    // SAFETY: registry queries on a loaded ggml.
    let all: Vec<(sys::ggml_backend_dev_t, String, sys::ggml_backend_dev_type)> = unsafe {
        (0..l.ggml_backend_dev_count())
            .map(|i| {
                let dev = l.ggml_backend_dev_get(i);
                (
                    dev,
                    cstr(l.ggml_backend_dev_name(dev)),
                    l.ggml_backend_dev_type(dev),
                )
            })
            .collect()
    };
    let is_cpu = |t: sys::ggml_backend_dev_type| {
        t == sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_CPU
    };
    if !named.is_empty() {
        let mut out = Vec::new();
        for want in named {
            let Some((dev, name, ty)) = all.iter().find(|(_, n, _)| n.eq_ignore_ascii_case(want))
            else {
                let names: Vec<&str> = all.iter().map(|(_, n, _)| n.as_str()).collect();
                return Err(OffloadError::NoDevice(format!(
                    "no ggml device named {want:?} (found: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                )));
            };
            if out.contains(dev) {
                return Err(OffloadError::NoDevice(format!(
                    "--device names {name} twice"
                )));
            }
            if is_cpu(*ty) && named.len() > 1 {
                return Err(OffloadError::NoDevice(format!(
                    "--device {}: {name} (ggml's CPU backend) is an offload device only on its \
                     own; the layers split over several devices run beside it",
                    named.join(",")
                )));
            }
            out.push(*dev);
        }
        return Ok(out);
    }
    let of = |want: sys::ggml_backend_dev_type| -> Vec<sys::ggml_backend_dev_t> {
        all.iter()
            .filter(|(_, n, t)| *t == want && !rpc.contains(n))
            .map(|(d, _, _)| *d)
            .collect()
    };
    let mut out: Vec<sys::ggml_backend_dev_t> = rpc
        .iter()
        .filter_map(|r| all.iter().find(|(_, n, _)| n == r).map(|(d, _, _)| *d))
        .collect();
    let gpus = of(sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_GPU);
    let igpus = of(sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_IGPU);
    let accel = of(sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_ACCEL);
    if !gpus.is_empty() {
        out.extend(gpus);
    } else if !igpus.is_empty() {
        out.extend(igpus);
    } else if out.is_empty() {
        out.extend(accel.into_iter().take(1));
    }
    if out.is_empty() {
        return Err(OffloadError::NoDevice(
            "no GPU device found (`rllama devices` says why; --device CPU runs the \
             offload path on ggml's CPU backend)"
                .into(),
        ));
    }
    Ok(out)
}

/// A backend of ggml's CPU device running `threads` threads, if the CPU backend is loaded.
///
/// # Safety
/// ggml is loaded; the caller frees the backend.
unsafe fn cpu_backend(l: &GgmlLib, threads: usize) -> Option<sys::ggml_backend_t> {
    let cpu = l.ggml_backend_dev_by_type(sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_CPU);
    if cpu.is_null() {
        return None;
    }
    let backend = l.ggml_backend_dev_init(cpu, std::ptr::null());
    if backend.is_null() {
        return None;
    }
    set_threads(l, cpu, backend, threads);
    Some(backend)
}

/// Allocates `ctx`'s tensors (the experts `--n-cpu-moe` keeps on the CPU) in host memory
/// on a backend of ggml's CPU device running `threads` threads. Frees `ctx` on failure.
unsafe fn host_experts(
    l: &GgmlLib,
    ctx: *mut ggml_context,
    threads: usize,
) -> Result<(sys::ggml_backend_buffer_t, sys::ggml_backend_t), OffloadError> {
    let Some(backend) = cpu_backend(l, threads) else {
        l.ggml_free(ctx);
        return Err(OffloadError::Backend(
            "--n-cpu-moe keeps experts on the CPU, but ggml's CPU backend is not loaded".into(),
        ));
    };
    let buf = l.ggml_backend_alloc_ctx_tensors(ctx, backend);
    if buf.is_null() {
        l.ggml_backend_free(backend);
        l.ggml_free(ctx);
        return Err(OffloadError::Backend(
            "out of host memory for the experts --n-cpu-moe keeps on the CPU".into(),
        ));
    }
    Ok((buf, backend))
}

/// The bytes of a layer's expert stacks (not their biases).
fn expert_bytes(w: &LayerW<Weight<'_>, &[f32]>) -> usize {
    match &w.ffn {
        FfnKind::Moe { experts, .. } => {
            let mut n = weight_bytes(&experts.down);
            match &experts.gate_up {
                GateUp::Split { gate, up } => n += weight_bytes(gate) + weight_bytes(up),
                GateUp::Fused(m) => n += weight_bytes(m),
            }
            n
        }
        FfnKind::Dense(_) => 0,
    }
}

/// Sets the CPU backend's thread count (ggml's other backends have no such call).
fn set_threads(
    l: &GgmlLib,
    dev: sys::ggml_backend_dev_t,
    backend: sys::ggml_backend_t,
    threads: usize,
) {
    let name = CString::new("ggml_backend_set_n_threads").unwrap();
    // SAFETY: the proc address, when present, has ggml_backend_set_n_threads_t's signature.
    unsafe {
        let reg = l.ggml_backend_dev_backend_reg(dev);
        let f = l.ggml_backend_reg_get_proc_address(reg, name.as_ptr());
        if !f.is_null() {
            let f: unsafe extern "C" fn(sys::ggml_backend_t, i32) = std::mem::transmute(f);
            f(backend, threads.max(1) as i32);
        }
    }
}
