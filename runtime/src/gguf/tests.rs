use super::writer::{to_bytes, WriteTensor};
use super::*;
use proptest::prelude::*;

fn sample() -> Vec<u8> {
    let f32_data: Vec<u8> = (0..64u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let q8_data = vec![0u8; 2 * 34];
    let meta = vec![
        (
            "general.architecture".to_string(),
            Value::String("llama".into()),
        ),
        ("general.alignment".to_string(), Value::U32(32)),
        ("llama.context_length".to_string(), Value::U32(2048)),
        ("x.f".to_string(), Value::F64(0.5)),
        ("x.b".to_string(), Value::Bool(true)),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(Array::String(vec!["<s>".into(), "a".into(), "é".into()])),
        ),
        (
            "x.nested".to_string(),
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, -2]),
                Array::U8(vec![7]),
            ])),
        ),
    ];
    let tensors = vec![
        WriteTensor {
            name: "a".into(),
            shape: vec![16, 4],
            ty: GgmlType::F32,
            data: &f32_data,
        },
        WriteTensor {
            name: "b".into(),
            shape: vec![64],
            ty: GgmlType::Q8_0,
            data: &q8_data,
        },
    ];
    to_bytes(&meta, &tensors)
}

#[test]
fn parses_what_the_writer_wrote() {
    let buf = sample();
    let p = parse_header(&buf).unwrap();
    assert_eq!(p.version, 3);
    assert_eq!(p.metadata.len(), 7);
    assert_eq!(p.tensors.len(), 2);
    assert_eq!(p.tensors[0].shape, vec![16, 4]);
    assert_eq!(p.tensors[1].ty, GgmlType::Q8_0);
    assert_eq!(p.tensors[1].size, 68);
    assert_eq!(p.data_offset % 32, 0);
    let nested = &p.metadata[6].1;
    assert_eq!(
        nested,
        &Value::Array(Array::Array(vec![
            Array::I32(vec![1, -2]),
            Array::U8(vec![7])
        ]))
    );
    let start = (p.data_offset + p.tensors[0].offset) as usize;
    assert_eq!(&buf[start + 4..start + 8], &1f32.to_le_bytes());
}

#[test]
fn every_truncation_is_an_error() {
    let buf = sample();
    for len in 0..buf.len() - 1 {
        // Trailing padding after the last tensor can be cut without harm; anything
        // before the last byte of tensor data cannot.
        let r = parse_header(&buf[..len]);
        let last_end = {
            let p = parse_header(&buf).unwrap();
            p.tensors
                .iter()
                .map(|t| p.data_offset + t.offset + t.size)
                .max()
                .unwrap()
        };
        if (len as u64) < last_end {
            assert!(r.is_err(), "truncation to {len} bytes parsed");
        }
    }
}

#[test]
fn bad_magic_version_and_huge_lengths() {
    let mut buf = sample();
    buf[0] = b'X';
    assert!(matches!(
        parse_header(&buf),
        Err(GgufError::BadMagic { .. })
    ));
    let mut buf = sample();
    buf[4] = 1;
    assert!(matches!(
        parse_header(&buf),
        Err(GgufError::UnsupportedVersion { version: 1 })
    ));
    // tensor count
    let mut buf = sample();
    buf[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = parse_header(&buf).unwrap_err().to_string();
    assert!(e.contains("tensor count"), "{e}");
    // metadata count
    let mut buf = sample();
    buf[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = parse_header(&buf).unwrap_err().to_string();
    assert!(e.contains("metadata count"), "{e}");
}

#[test]
fn huge_array_length_is_rejected_without_allocating() {
    let meta = vec![(
        "tokenizer.ggml.tokens".to_string(),
        Value::Array(Array::String(vec!["a".into()])),
    )];
    let mut buf = to_bytes(&meta, &[]);
    // key: 8 + 21 bytes, type 4, elem type 4, then the length at offset 24 + 29 + 8.
    let len_at = 24 + 8 + 21 + 4 + 4;
    buf[len_at..len_at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let e = parse_header(&buf).unwrap_err().to_string();
    assert!(e.contains("array length"), "{e}");
    assert!(e.contains(&format!("offset {len_at}")), "{e}");
}

#[test]
fn corrupt_tensor_offset_is_named() {
    let buf = sample();
    let p = parse_header(&buf).unwrap();
    let _ = p;
    // Find tensor "b"'s offset field: search for the name then skip dims and type.
    let pos = buf
        .windows(9)
        .position(|w| w == b"\x01\0\0\0\0\0\0\0b")
        .unwrap()
        + 9;
    let off_at = pos + 4 + 8 + 4;
    let mut bad = buf.clone();
    bad[off_at..off_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = parse_header(&bad).unwrap_err().to_string();
    assert!(e.contains("tensor \"b\""), "{e}");
    let mut misaligned = buf.clone();
    misaligned[off_at..off_at + 8].copy_from_slice(&3u64.to_le_bytes());
    let e = parse_header(&misaligned).unwrap_err().to_string();
    assert!(e.contains("alignment"), "{e}");
}

#[test]
fn counts_lengths_and_dimensions_have_caps() {
    // Counts above the caps are refused by name even when the file could hold them.
    let mut buf = sample();
    buf[8..16].copy_from_slice(&(MAX_TENSORS + 1).to_le_bytes());
    let e = parse_header(&buf).unwrap_err().to_string();
    assert!(e.contains("tensor count") && e.contains("cap"), "{e}");
    let mut buf = sample();
    buf[16..24].copy_from_slice(&(MAX_METADATA_KV + 1).to_le_bytes());
    let e = parse_header(&buf).unwrap_err().to_string();
    assert!(e.contains("metadata count") && e.contains("cap"), "{e}");

    let meta = vec![("x".to_string(), Value::Array(Array::U8(vec![1])))];
    let mut buf = to_bytes(&meta, &[]);
    let len_at = 24 + 8 + 1 + 4 + 4;
    buf[len_at..len_at + 8].copy_from_slice(&(MAX_ARRAY_LEN + 1).to_le_bytes());
    let e = parse_header(&buf).unwrap_err().to_string();
    assert!(e.contains("array length") && e.contains("cap"), "{e}");

    // One dimension above MAX_DIM, and dimensions whose product passes the element cap.
    let data = vec![0u8; 4];
    let t = |shape: Vec<u64>| {
        to_bytes(
            &[],
            &[WriteTensor {
                name: "t".into(),
                shape,
                ty: GgmlType::F32,
                data: &data,
            }],
        )
    };
    let e = parse_header(&t(vec![1, MAX_DIM + 1]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("dim 1") && e.contains("above"), "{e}");
    let e = parse_header(&t(vec![1 << 21, 1 << 20]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("dim 1") && e.contains("exceed"), "{e}");
}

#[test]
fn tensor_data_beyond_the_file_is_refused_at_open() {
    let buf = sample();
    let p = parse_header(&buf).unwrap();
    let end = p
        .tensors
        .iter()
        .map(|t| p.data_offset + t.offset + t.size)
        .max()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    std::fs::write(&path, &buf[..end as usize - 1]).unwrap();
    let e = GgufFile::open(&path).unwrap_err().to_string();
    assert!(e.contains("lies outside"), "{e}");
    // The same image from memory gets the same answer.
    let e = GgufFile::from_bytes("cut", buf[..end as usize - 1].to_vec())
        .unwrap_err()
        .to_string();
    assert!(e.contains("lies outside"), "{e}");
    assert!(GgufFile::from_bytes("whole", buf).is_ok());
}

#[test]
fn deep_nesting_is_capped() {
    let mut a = Array::U8(vec![1]);
    for _ in 0..20 {
        a = Array::Array(vec![a]);
    }
    let buf = to_bytes(&[("deep".to_string(), Value::Array(a))], &[]);
    let e = parse_header(&buf).unwrap_err().to_string();
    assert!(e.contains("nested deeper"), "{e}");
}

#[test]
fn duplicate_keys_and_tensors_are_rejected() {
    let meta = vec![
        ("k".to_string(), Value::U32(1)),
        ("k".to_string(), Value::U32(2)),
    ];
    assert!(parse_header(&to_bytes(&meta, &[]))
        .unwrap_err()
        .to_string()
        .contains("duplicate"));
    let d = [0u8; 4];
    let t = |n: &str| WriteTensor {
        name: n.into(),
        shape: vec![1],
        ty: GgmlType::F32,
        data: &d,
    };
    let buf = to_bytes(&[], &[t("x"), t("x")]);
    assert!(parse_header(&buf)
        .unwrap_err()
        .to_string()
        .contains("duplicate"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    /// Random bytes never panic.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_header(&bytes);
    }

    /// Random bytes after a valid magic and version never panic.
    #[test]
    fn random_body_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = b"GGUF\x03\0\0\0".to_vec();
        bytes.extend_from_slice(&body);
        let _ = parse_header(&bytes);
    }

    /// Mutating bytes of a valid file never panics, and any success stays in bounds.
    #[test]
    fn mutations_never_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut buf = sample();
        for (i, b) in edits {
            let at = i.index(buf.len());
            buf[at] = b;
        }
        if let Ok(p) = parse_header(&buf) {
            for t in &p.tensors {
                prop_assert!(p.data_offset + t.offset + t.size <= buf.len() as u64);
            }
        }
    }
}

#[test]
fn stream_writer_matches_the_in_memory_writer() {
    use super::writer::{StreamWriter, TensorSpec};
    // Sizes that are not multiples of the alignment, so padding is exercised.
    let a: Vec<u8> = (0..3u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let b: Vec<u8> = (0..2 * 34).map(|i| i as u8).collect();
    let c: Vec<u8> = (0..5u32)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let meta = vec![
        (
            "general.architecture".to_string(),
            Value::String("llama".into()),
        ),
        ("general.alignment".to_string(), Value::U32(64)),
    ];
    let tensors = [
        ("a", vec![3u64], GgmlType::F32, &a),
        ("b", vec![32, 2], GgmlType::Q8_0, &b),
        ("c", vec![5], GgmlType::F32, &c),
    ];
    let expected = to_bytes(
        &meta,
        &tensors
            .iter()
            .map(|(n, s, t, d)| WriteTensor {
                name: n.to_string(),
                shape: s.clone(),
                ty: *t,
                data: d,
            })
            .collect::<Vec<_>>(),
    );
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(n, s, t, _)| TensorSpec {
            name: n.to_string(),
            shape: s.clone(),
            ty: *t,
        })
        .collect();
    let mut w = StreamWriter::new(Vec::new(), &meta, &specs).unwrap();
    // Pieces that straddle tensor boundaries.
    let all: Vec<u8> = [a.as_slice(), &b, &c].concat();
    for piece in all.chunks(7) {
        w.write_data(piece).unwrap();
    }
    assert_eq!(w.current(), None);
    let out = w.finish().unwrap();
    assert_eq!(out, expected);
    assert!(GgufFile::from_bytes("stream", out).is_ok());

    // Too little data, too much data, and rows that are not whole blocks are errors.
    let mut short = StreamWriter::new(Vec::new(), &meta, &specs).unwrap();
    short.write_data(&all[..all.len() - 1]).unwrap();
    assert!(short.finish().is_err());
    let mut long = StreamWriter::new(Vec::new(), &meta, &specs).unwrap();
    assert!(long.write_data(&[all.as_slice(), &[0]].concat()).is_err());
    let bad = TensorSpec {
        name: "q".into(),
        shape: vec![31, 2],
        ty: GgmlType::Q8_0,
    };
    assert!(StreamWriter::new(Vec::new(), &meta, &[bad]).is_err());
}
