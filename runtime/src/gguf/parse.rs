//! The bounds-checked GGUF header parser. It works on a byte slice so tests and fuzzers can
//! drive it without files.

use std::collections::HashSet;

use quant::GgmlType;

use super::{
    Array, GgufError, TensorInfo, Value, ValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH,
    MAX_ARRAY_LEN, MAX_DIM, MAX_DIMS, MAX_METADATA_KV, MAX_STRING_LEN, MAX_TENSORS,
    MAX_TENSOR_ELEMENTS,
};

/// Everything the header says, before the map is attached.
#[derive(Debug)]
pub struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                field: field(),
                offset: self.pos as u64,
                needed: n,
                available: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn invalid(&self, field: String, offset: usize, reason: impl Into<String>) -> GgufError {
        GgufError::Invalid {
            field,
            offset: offset as u64,
            reason: reason.into(),
        }
    }

    fn string(&mut self, field: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.u64(&|| format!("{} (string length)", field()))?;
        if len > MAX_STRING_LEN {
            return Err(self.invalid(
                field(),
                at,
                format!("string length {len} exceeds the cap of {MAX_STRING_LEN} bytes"),
            ));
        }
        let bytes = self.take(len, field)?;
        // Vocabularies occasionally hold invalid UTF-8 pieces; keep them lossily rather than
        // rejecting the model (llama.cpp stores them as raw bytes).
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value_type(&mut self, field: &dyn Fn() -> String) -> Result<ValueType, GgufError> {
        let at = self.pos;
        let raw = self.u32(field)?;
        ValueType::from_u32(raw)
            .ok_or_else(|| self.invalid(field(), at, format!("unknown value type {raw}")))
    }

    fn value(
        &mut self,
        ty: ValueType,
        field: &dyn Fn() -> String,
        depth: u32,
    ) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(field)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(field)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            ValueType::Bool => {
                let at = self.pos;
                match self.array::<1>(field)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(self.invalid(
                            field(),
                            at,
                            format!("bool byte is {b}, expected 0 or 1"),
                        ))
                    }
                }
            }
            ValueType::String => Value::String(self.string(field)?),
            ValueType::Array => Value::Array(self.array_value(field, depth + 1)?),
        })
    }

    fn array_value(&mut self, field: &dyn Fn() -> String, depth: u32) -> Result<Array, GgufError> {
        let at = self.pos;
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.invalid(
                field(),
                at,
                format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
            ));
        }
        let ety = self.value_type(&|| format!("{} (array element type)", field()))?;
        let len_at = self.pos;
        let len = self.u64(&|| format!("{} (array length)", field()))?;
        if len > MAX_ARRAY_LEN {
            return Err(self.invalid(
                format!("{} (array length)", field()),
                len_at,
                format!("{len} elements exceed the cap of {MAX_ARRAY_LEN}"),
            ));
        }
        // Every element takes at least this many bytes, so a length the rest of the file
        // cannot hold is rejected before any allocation.
        let min_elem = match ety {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        };
        match len.checked_mul(min_elem) {
            Some(need) if need <= self.remaining() => {}
            _ => {
                return Err(self.invalid(
                    format!("{} (array length)", field()),
                    len_at,
                    format!(
                        "{len} elements of {} cannot fit in the {} bytes left in the file",
                        ety.name(),
                        self.remaining()
                    ),
                ))
            }
        }
        let n = len as usize;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let size = std::mem::size_of::<$t>();
                let bytes = self.take((n * size) as u64, field)?;
                Array::$variant(
                    bytes
                        .chunks_exact(size)
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()))
                        .collect(),
                )
            }};
        }
        Ok(match ety {
            ValueType::U8 => Array::U8(self.take(n as u64, field)?.to_vec()),
            ValueType::I8 => Array::I8(
                self.take(n as u64, field)?
                    .iter()
                    .map(|&b| b as i8)
                    .collect(),
            ),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => {
                let start = self.pos;
                let bytes = self.take(n as u64, field)?;
                if let Some(i) = bytes.iter().position(|&b| b > 1) {
                    return Err(self.invalid(
                        field(),
                        start + i,
                        format!("bool byte is {}", bytes[i]),
                    ));
                }
                Array::Bool(bytes.iter().map(|&b| b == 1).collect())
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string(&|| format!("{}[{i}]", field()))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.array_value(&|| format!("{}[{i}]", field()), depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

/// Parses and validates a complete GGUF image (header, metadata, tensor table, and that
/// every tensor's data lies inside `buf`).
pub fn parse_header(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    let magic_bytes: [u8; 4] = c.array(&|| "magic".into())?;
    if u32::from_le_bytes(magic_bytes) != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic_bytes });
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let n_tensors_at = c.pos;
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv_at = c.pos;
    let n_kv = c.u64(&|| "metadata count".into())?;
    if n_kv > MAX_METADATA_KV {
        return Err(c.invalid(
            "metadata count".into(),
            n_kv_at,
            format!("{n_kv} entries exceed the cap of {MAX_METADATA_KV}"),
        ));
    }
    if n_tensors > MAX_TENSORS {
        return Err(c.invalid(
            "tensor count".into(),
            n_tensors_at,
            format!("{n_tensors} tensors exceed the cap of {MAX_TENSORS}"),
        ));
    }
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
    // least 8 + 4 + 8 + 4 + 8.
    if n_kv.checked_mul(13).is_none_or(|b| b > c.remaining()) {
        return Err(c.invalid(
            "metadata count".into(),
            n_kv_at,
            format!("{n_kv} entries cannot fit in a {}-byte file", buf.len()),
        ));
    }
    if n_tensors.checked_mul(32).is_none_or(|b| b > c.remaining()) {
        return Err(c.invalid(
            "tensor count".into(),
            n_tensors_at,
            format!(
                "{n_tensors} tensors cannot fit in a {}-byte file",
                buf.len()
            ),
        ));
    }

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut keys = HashSet::new();
    for i in 0..n_kv {
        let key_at = c.pos;
        let key = c.string(&|| format!("metadata[{i}] key"))?;
        if !keys.insert(key.clone()) {
            return Err(c.invalid(format!("metadata key {key:?}"), key_at, "duplicate key"));
        }
        let ty = c.value_type(&|| format!("metadata {key:?} type"))?;
        let value = c.value(ty, &|| format!("metadata {key:?}"), 0)?;
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            return Err(GgufError::Metadata {
                key: "general.alignment".into(),
                reason: format!("must be a non-zero power of two u32, found {v}"),
            })
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let name_at = c.pos;
        let name = c.string(&|| format!("tensor[{i}] name"))?;
        if !names.insert(name.clone()) {
            return Err(c.invalid(
                format!("tensor {name:?} name"),
                name_at,
                "duplicate tensor name",
            ));
        }
        let dims_at = c.pos;
        let n_dims = c.u32(&|| format!("tensor {name:?} dimension count"))?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(c.invalid(
                format!("tensor {name:?} dimension count"),
                dims_at,
                format!("{n_dims} dimensions (must be 1..={MAX_DIMS})"),
            ));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        let mut n_elements: u64 = 1;
        for d in 0..n_dims {
            let at = c.pos;
            let dim = c.u64(&|| format!("tensor {name:?} dim {d}"))?;
            n_elements = match n_elements.checked_mul(dim) {
                Some(n) if dim > 0 && dim <= MAX_DIM && n <= MAX_TENSOR_ELEMENTS => n,
                _ => {
                    return Err(c.invalid(
                        format!("tensor {name:?} dim {d}"),
                        at,
                        format!(
                            "dimension {dim} is zero, above {MAX_DIM}, or makes the element \
                             count exceed {MAX_TENSOR_ELEMENTS}"
                        ),
                    ))
                }
            };
            shape.push(dim);
        }
        let ty_at = c.pos;
        let raw_ty = c.u32(&|| format!("tensor {name:?} type"))?;
        let ty = GgmlType::from_u32(raw_ty).ok_or_else(|| {
            c.invalid(
                format!("tensor {name:?} type"),
                ty_at,
                format!("unknown ggml type id {raw_ty}"),
            )
        })?;
        let off_at = c.pos;
        let offset = c.u64(&|| format!("tensor {name:?} offset"))?;
        if offset % alignment != 0 {
            return Err(c.invalid(
                format!("tensor {name:?} offset"),
                off_at,
                format!("{offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        if shape[0] % ty.block_size() as u64 != 0 {
            return Err(c.invalid(
                format!("tensor {name:?} shape"),
                dims_at,
                format!(
                    "row length {} is not a multiple of the {ty} block size {}",
                    shape[0],
                    ty.block_size()
                ),
            ));
        }
        let size = ty
            .row_bytes(shape[0])
            .and_then(|row| row.checked_mul(n_elements / shape[0]))
            .ok_or_else(|| {
                c.invalid(
                    format!("tensor {name:?} shape"),
                    dims_at,
                    "byte size overflows",
                )
            })?;
        tensors.push(TensorInfo {
            name,
            shape,
            ty,
            offset,
            size,
        });
    }

    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    if data_offset > file_len && !tensors.is_empty() {
        return Err(GgufError::Truncated {
            field: "tensor data section".into(),
            offset: c.pos as u64,
            needed: data_offset - c.pos as u64,
            available: file_len - c.pos as u64,
        });
    }
    let data_len = file_len.saturating_sub(data_offset);
    for t in &tensors {
        match t.offset.checked_add(t.size) {
            Some(end) if end <= data_len => {}
            _ => {
                return Err(GgufError::Tensor {
                    name: t.name.clone(),
                    reason: format!(
                        "data [{}, +{}) at file offset {} lies outside the {}-byte data section (file truncated or offset corrupt)",
                        t.offset,
                        t.size,
                        data_offset.saturating_add(t.offset),
                        data_len
                    ),
                })
            }
        }
    }
    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
    })
}
