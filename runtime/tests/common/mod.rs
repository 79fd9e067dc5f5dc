//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub use runtime::registry::test_model as model;

pub const MODELS: [&str; 3] = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"];

/// A copy of `src` with every tensor dequantized to f32, written once into
/// `target/f32-models/`: the same weights evaluated without the 8-bit rounding of the
/// activations that our CPU path (as llama.cpp's) applies in its quantized products. A
/// device that multiplies in floating point comes closer to this than to the CPU path.
pub fn dequantized_f32(src: &std::path::Path) -> std::path::PathBuf {
    use runtime::gguf::writer::{StreamWriter, TensorSpec};
    use runtime::gguf::Value;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/f32-models");
    let stem = src.file_stem().unwrap().to_string_lossy();
    let out = dir.join(format!("{stem}-f32.gguf"));
    if out.is_file() {
        return out;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let g = runtime::GgufFile::open(src).unwrap();
    let mut meta = g.metadata.clone();
    for (k, v) in &mut meta {
        if k == "general.file_type" {
            *v = Value::U32(0); // all F32
        }
    }
    let specs: Vec<TensorSpec> = g
        .tensors
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            shape: t.shape.clone(),
            ty: quant::GgmlType::F32,
        })
        .collect();
    let tmp = dir.join(format!("{stem}.{}.tmp", std::process::id()));
    let file = std::io::BufWriter::new(std::fs::File::create(&tmp).unwrap());
    let mut w = StreamWriter::new(file, &meta, &specs).unwrap();
    for t in &g.tensors {
        let data = g.tensor_data(t);
        let row = t.row_len() as usize;
        let row_bytes = data.len() / t.n_rows() as usize;
        let mut f = vec![0f32; row];
        for r in data.chunks_exact(row_bytes) {
            quant::dequantize_row(t.ty, r, &mut f).unwrap();
            let bytes: Vec<u8> = f.iter().flat_map(|x| x.to_le_bytes()).collect();
            w.write_data(&bytes).unwrap();
        }
    }
    w.finish().unwrap();
    std::fs::rename(&tmp, &out).unwrap();
    out
}
