//! GGUF v2/v3 reader over a memory map.
//!
//! The header, metadata and tensor table are parsed eagerly into owned values (they are
//! small); tensor data is borrowed straight from the map. Every length read from the file
//! is checked against the bytes that remain before anything is allocated, so a hostile
//! file can at worst produce an error naming the field and its byte offset.

mod parse;
pub mod writer;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use quant::GgmlType;

pub use parse::{parse_header, Parsed};

/// GGUF magic, "GGUF" read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Default tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Longest string we accept (chat templates are a few KiB; this is generous).
pub const MAX_STRING_LEN: u64 = 64 << 20;
/// Deepest array-of-array nesting accepted.
pub const MAX_ARRAY_DEPTH: u32 = 8;
/// Most elements in one metadata array (the largest vocabularies and merge lists hold a
/// few hundred thousand entries).
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Most metadata entries in one file (real models have tens to a few hundred).
pub const MAX_METADATA_KV: u64 = 1 << 16;
/// Most tensors in one file (large mixture-of-experts models have a few thousand).
pub const MAX_TENSORS: u64 = 1 << 16;
/// Largest single dimension of a tensor.
pub const MAX_DIM: u64 = 1 << 32;
/// Most elements in one tensor (2^40: a trillion, far above any real weight matrix).
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic at offset 0 is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} at offset 4 (supported: 2 and 3, little-endian)")]
    UnsupportedVersion { version: u32 },
    #[error("truncated file: {field} at byte offset {offset} needs {needed} bytes but only {available} remain")]
    Truncated {
        field: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("invalid {field} at byte offset {offset}: {reason}")]
    Invalid {
        field: String,
        offset: u64,
        reason: String,
    },
    #[error("metadata key {key:?}: {reason}")]
    Metadata { key: String, reason: String },
    #[error("tensor {name:?}: {reason}")]
    Tensor { name: String, reason: String },
}

/// The scalar type tag of a metadata value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_u32(v: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match v {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Encoded size of one value of a fixed-size type; strings and arrays are variable.
    pub fn fixed_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata value. Arrays keep their elements in typed vectors so that a 262k-entry
/// vocabulary costs one allocation per string, not one enum per element.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Integer elements widened to i64 (token types, ids); `None` for non-integer arrays.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            Array::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U64(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I64(v) => v.clone(),
            _ => return None,
        })
    }

    /// Float elements (scores); integers are converted too.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        match self {
            Array::F32(v) => Some(v.clone()),
            Array::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => self
                .to_i64_vec()
                .map(|v| v.into_iter().map(|x| x as f32).collect()),
        }
    }

    fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Array::U8(v) => J::from(v.clone()),
            Array::I8(v) => J::from(v.clone()),
            Array::U16(v) => J::from(v.clone()),
            Array::I16(v) => J::from(v.clone()),
            Array::U32(v) => J::from(v.clone()),
            Array::I32(v) => J::from(v.clone()),
            Array::F32(v) => J::from(v.clone()),
            Array::Bool(v) => J::from(v.clone()),
            Array::String(v) => J::from(v.clone()),
            Array::Array(v) => J::Array(v.iter().map(|a| a.to_json()).collect()),
            Array::U64(v) => J::from(v.clone()),
            Array::I64(v) => J::from(v.clone()),
            Array::F64(v) => J::from(v.clone()),
        }
    }
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value as i64 (GGUF writers disagree on u32 vs i32 vs u64 for counts).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(x) => x as i64,
            Value::I8(x) => x as i64,
            Value::U16(x) => x as i64,
            Value::I16(x) => x as i64,
            Value::U32(x) => x as i64,
            Value::I32(x) => x as i64,
            Value::U64(x) => i64::try_from(x).ok()?,
            Value::I64(x) => x,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x as f64),
            Value::F64(x) => Some(x),
            _ => self.as_i64().map(|x| x as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::U8(x) => J::from(*x),
            Value::I8(x) => J::from(*x),
            Value::U16(x) => J::from(*x),
            Value::I16(x) => J::from(*x),
            Value::U32(x) => J::from(*x),
            Value::I32(x) => J::from(*x),
            Value::F32(x) => J::from(*x),
            Value::Bool(x) => J::from(*x),
            Value::String(x) => J::from(x.clone()),
            Value::Array(a) => a.to_json(),
            Value::U64(x) => J::from(*x),
            Value::I64(x) => J::from(*x),
            Value::F64(x) => J::from(*x),
        }
    }
}

impl fmt::Display for Value {
    /// Short human form: long arrays are summarised, long strings are cut.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => {
                let one_line: String = s.chars().take(60).collect::<String>().replace('\n', "\\n");
                if s.chars().count() > 60 {
                    write!(f, "{one_line:?}…")
                } else {
                    write!(f, "{one_line:?}")
                }
            }
            Value::Array(a) => write!(f, "[{}; {}]", a.elem_type().name(), a.len()),
            other => write!(f, "{}", other.to_json()),
        }
    }
}

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `shape[0]` is the row length (contiguous), `shape[1]` the row count.
    pub shape: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes of data (whole blocks).
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Number of rows (product of all dims after the first).
    pub fn n_rows(&self) -> u64 {
        self.shape.iter().skip(1).product()
    }

    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }
}

/// Where a GGUF image lives: a read-only map of a file, or bytes in memory (tests,
/// fuzzers, images received over the wire).
enum Image {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Image {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Image::Map(m) => m,
            Image::Owned(v) => v,
        }
    }
}

/// An opened GGUF file: parsed header plus the map that tensor data is borrowed from.
pub struct GgufFile {
    path: PathBuf,
    map: Image,
    pub version: u32,
    pub alignment: u64,
    /// Absolute file offset where tensor data begins.
    pub data_offset: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and maps `path`, validating the whole header and tensor table.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = std::fs::File::open(&path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::other("is a directory")));
        }
        // SAFETY: the map is read-only; as with every mmap reader, a file truncated by
        // another process while mapped can fault. Model files are not modified in place
        // (our fetch writes a temporary file and renames it).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let parsed = parse_header(&map)?;
        Ok(Self::from_parsed(path, Image::Map(map), parsed))
    }

    /// Parses a GGUF image held in memory, with the same checks as [`GgufFile::open`];
    /// `name` stands in for the path in messages.
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let parsed = parse_header(&bytes)?;
        Ok(Self::from_parsed(name.into(), Image::Owned(bytes), parsed))
    }

    fn from_parsed(path: PathBuf, map: Image, p: Parsed) -> GgufFile {
        let meta_index = p
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = p
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        GgufFile {
            path,
            map,
            version: p.version,
            alignment: p.alignment,
            data_offset: p.data_offset,
            metadata: p.metadata,
            tensors: p.tensors,
            meta_index,
            tensor_index,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole mapped file (tensor offsets are relative to `data_offset` within it).
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Lets go of this process's resident pages of `bytes()[start..start + len]` (the
    /// whole pages inside it), for ranges it will not read for a while: a mapped file's
    /// pages come back from the page cache when read again, unchanged. Bytes held in
    /// memory are kept (there is nothing to read them back from).
    pub fn release_range(&self, start: usize, len: usize) {
        let Image::Map(m) = &self.map else {
            return;
        };
        let page = 4096;
        let (a, b) = (
            start.next_multiple_of(page),
            (start + len).min(m.len()) / page * page,
        );
        if b > a {
            // SAFETY: a read-only shared file mapping: dropped pages are read again from
            // the file, so no byte anyone borrowed changes.
            let _ =
                unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a) };
        }
    }

    pub fn file_size(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn meta_err(key: &str, reason: impl Into<String>) -> GgufError {
        GgufError::Metadata {
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| {
                Self::meta_err(
                    key,
                    format!("expected a string, found {}", v.value_type().name()),
                )
            }),
        }
    }

    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| {
                Self::meta_err(
                    key,
                    format!("expected an integer, found {}", v.value_type().name()),
                )
            }),
        }
    }

    /// An integer that must be a non-negative count (context length, head count, ...).
    pub fn get_usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        match self.get_i64(key)? {
            None => Ok(None),
            Some(v) => usize::try_from(v).map(Some).map_err(|_| {
                Self::meta_err(key, format!("expected a non-negative count, found {v}"))
            }),
        }
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                Self::meta_err(
                    key,
                    format!("expected a number, found {}", v.value_type().name()),
                )
            }),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                Self::meta_err(
                    key,
                    format!("expected a bool, found {}", v.value_type().name()),
                )
            }),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| {
                Self::meta_err(
                    key,
                    format!("expected an array, found {}", v.value_type().name()),
                )
            }),
        }
    }

    /// `general.architecture`, required by every model loader.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")?
            .ok_or_else(|| Self::meta_err("general.architecture", "missing"))
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes, borrowed from the map (bounds were checked at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.map[start..start + t.size as usize]
    }

    pub fn n_params(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_elements()).sum()
    }

    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size).sum()
    }

    /// `general.file_type` rendered as llama.cpp's ftype name, when known.
    pub fn file_type_name(&self) -> Option<String> {
        let ft = self.get("general.file_type")?.as_i64()?;
        Some(
            ftype_name(ft)
                .map(str::to_string)
                .unwrap_or_else(|| format!("ftype {ft}")),
        )
    }
}

/// llama.cpp's `llama_ftype` names (the `general.file_type` key).
pub fn ftype_name(ft: i64) -> Option<&'static str> {
    Some(match ft {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        25 => "IQ4_NL - 4.5 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        32 => "BF16",
        38 => "MXFP4 MoE",
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
