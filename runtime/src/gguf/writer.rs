//! A small GGUF v3 writer: [`to_bytes`] builds a whole image in memory (test fixtures),
//! [`StreamWriter`] writes the header first and then streams each tensor's data, so files
//! larger than memory (`rllama synth`) never exist as one buffer.

use std::io::{self, Write};

use quant::GgmlType;

use super::{Array, Value, DEFAULT_ALIGNMENT, GGUF_MAGIC};

/// A tensor to write: name, ggml shape, type and its already-encoded bytes.
pub struct WriteTensor<'a> {
    pub name: String,
    pub shape: Vec<u64>,
    pub ty: GgmlType,
    pub data: &'a [u8],
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| b as u8)),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn alignment_of(metadata: &[(String, Value)]) -> u64 {
    metadata
        .iter()
        .find(|(k, _)| k == "general.alignment")
        .and_then(|(_, v)| v.as_i64())
        .map(|a| a as u64)
        .unwrap_or(DEFAULT_ALIGNMENT)
}

/// The header, metadata, tensor table and padding up to the data section, for tensors of
/// `sizes[i]` data bytes each (every tensor's data starts on an `alignment` boundary).
fn header_bytes(
    metadata: &[(String, Value)],
    tensors: &[(&str, &[u64], GgmlType)],
    sizes: &[u64],
    alignment: u64,
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_str(&mut out, k);
        out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0u64;
    for (&(name, shape, ty), &size) in tensors.iter().zip(sizes) {
        put_str(&mut out, name);
        out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&(ty as u32).to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + size).div_ceil(alignment) * alignment;
    }
    let target = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(target as usize, 0);
    out
}

/// Serialises a GGUF v3 image. Alignment comes from `general.alignment` if present.
pub fn to_bytes(metadata: &[(String, Value)], tensors: &[WriteTensor<'_>]) -> Vec<u8> {
    let alignment = alignment_of(metadata);
    let table: Vec<(&str, &[u64], GgmlType)> = tensors
        .iter()
        .map(|t| (t.name.as_str(), t.shape.as_slice(), t.ty))
        .collect();
    let sizes: Vec<u64> = tensors.iter().map(|t| t.data.len() as u64).collect();
    let mut out = header_bytes(metadata, &table, &sizes, alignment);
    let pad = |out: &mut Vec<u8>| {
        let target = (out.len() as u64).div_ceil(alignment) * alignment;
        out.resize(target as usize, 0);
    };
    for t in tensors {
        out.extend_from_slice(t.data);
        pad(&mut out);
    }
    out
}

/// Writes the image to `w`.
pub fn write(
    w: &mut impl Write,
    metadata: &[(String, Value)],
    tensors: &[WriteTensor<'_>],
) -> io::Result<()> {
    w.write_all(&to_bytes(metadata, tensors))
}

/// A tensor of a streamed file: its table entry; the data comes later.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    /// ggml order: `shape[0]` is the row length.
    pub shape: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes of data: whole blocks of `ty` (the row length must be a multiple of the
    /// block size, which [`StreamWriter::new`] checks).
    pub fn data_bytes(&self) -> u64 {
        self.n_elements() / self.ty.block_size() as u64 * self.ty.type_size() as u64
    }
}

/// Writes a GGUF v3 file header first, then tensor data in table order as it is produced:
/// `new` writes everything up to the data section, each tensor's bytes go through
/// [`StreamWriter::write_data`] (in any number of pieces), and `finish` checks that every
/// tensor got exactly its size. Padding between tensors is inserted here.
pub struct StreamWriter<W: Write> {
    w: W,
    alignment: u64,
    sizes: Vec<u64>,
    names: Vec<String>,
    /// Index of the tensor being written and the bytes it has so far.
    current: usize,
    written: u64,
    total: u64,
}

impl<W: Write> StreamWriter<W> {
    pub fn new(
        mut w: W,
        metadata: &[(String, Value)],
        tensors: &[TensorSpec],
    ) -> io::Result<StreamWriter<W>> {
        let alignment = alignment_of(metadata);
        for t in tensors {
            let row = t.shape.first().copied().unwrap_or(0);
            if t.n_elements() == 0 || !row.is_multiple_of(t.ty.block_size() as u64) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "tensor {}: row length {row} is not a whole number of {} blocks",
                        t.name, t.ty
                    ),
                ));
            }
        }
        let table: Vec<(&str, &[u64], GgmlType)> = tensors
            .iter()
            .map(|t| (t.name.as_str(), t.shape.as_slice(), t.ty))
            .collect();
        let sizes: Vec<u64> = tensors.iter().map(TensorSpec::data_bytes).collect();
        let header = header_bytes(metadata, &table, &sizes, alignment);
        w.write_all(&header)?;
        Ok(StreamWriter {
            w,
            alignment,
            total: header.len() as u64,
            sizes,
            names: tensors.iter().map(|t| t.name.clone()).collect(),
            current: 0,
            written: 0,
        })
    }

    /// The tensor the next bytes belong to (`None` once all are complete).
    pub fn current(&self) -> Option<usize> {
        (self.current < self.sizes.len()).then_some(self.current)
    }

    /// Appends data to the current tensor, moving on (with padding) when it is complete.
    /// Bytes beyond the current tensor's size continue into the next tensor.
    pub fn write_data(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let Some(&size) = self.sizes.get(self.current) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "more tensor data than the table describes",
                ));
            };
            let take = (size - self.written).min(bytes.len() as u64) as usize;
            self.w.write_all(&bytes[..take])?;
            self.written += take as u64;
            self.total += take as u64;
            bytes = &bytes[take..];
            if self.written == size {
                let padded = self.total.div_ceil(self.alignment) * self.alignment;
                let zeros = [0u8; 64];
                let mut pad = padded - self.total;
                while pad > 0 {
                    let n = pad.min(zeros.len() as u64);
                    self.w.write_all(&zeros[..n as usize])?;
                    pad -= n;
                }
                self.total = padded;
                self.current += 1;
                self.written = 0;
            }
        }
        Ok(())
    }

    /// Bytes written so far (header included).
    pub fn bytes_written(&self) -> u64 {
        self.total
    }

    /// Flushes and returns the sink; an error if a tensor is missing data.
    pub fn finish(mut self) -> io::Result<W> {
        if let Some(name) = self.names.get(self.current) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "tensor {name} got {} of its {} bytes",
                    self.written, self.sizes[self.current]
                ),
            ));
        }
        self.w.flush()?;
        Ok(self.w)
    }
}
