//! `rbench membw`: the memory bandwidth table parses and reports positive figures.

use std::process::Command;

/// The cells of each of the table's data rows, by header.
fn table(stdout: &str) -> Vec<Vec<(String, String)>> {
    let lines: Vec<&str> = stdout.lines().take_while(|l| l.starts_with('|')).collect();
    assert!(lines.len() >= 3, "header, rule, rows:\n{stdout}");
    let cells = |l: &str| -> Vec<String> {
        l.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    assert!(cells(lines[1]).iter().all(|c| c.ends_with(':')), "{stdout}");
    lines[2..]
        .iter()
        .map(|l| cells(lines[0]).into_iter().zip(cells(l)).collect())
        .collect()
}

fn get<'a>(row: &'a [(String, String)], key: &str) -> &'a str {
    &row.iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no column {key}: {row:?}"))
        .1
}

#[test]
fn membw_reports_positive_bandwidth() {
    let out = Command::new(env!("CARGO_BIN_EXE_rbench"))
        .args(["membw", "--size-mib", "64", "-r", "2", "-t", "1"])
        .output()
        .expect("run rbench membw");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{stdout}");
    let rows = table(&stdout);
    // The plain read, then (x86 with AVX2) the read that prefetches ahead.
    let kernels: Vec<&str> = rows.iter().map(|r| get(r, "kernel")).collect();
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    if avx2 {
        assert_eq!(kernels, ["avx2", "avx2+prefetch"], "{stdout}");
        assert!(stdout.contains("The higher row is the ceiling"), "{stdout}");
    } else {
        assert_eq!(kernels, ["scalar"], "{stdout}");
    }
    for row in &rows {
        assert_eq!(get(row, "threads"), "1");
        assert_eq!(get(row, "buffer MiB"), "64");
        assert_eq!(get(row, "reps"), "2");
        let gbps = |k: &str| -> f64 {
            let v: f64 = get(row, k)
                .parse()
                .unwrap_or_else(|_| panic!("{k}: {row:?}"));
            assert!(v.is_finite() && v > 0.0, "{k} = {v}");
            v
        };
        let (median, min, max) = (gbps("median GB/s"), gbps("min GB/s"), gbps("max GB/s"));
        assert!(min <= median && median <= max, "{row:?}");
    }
}

#[test]
fn membw_rejects_bad_values() {
    for args in [["-t", "0"], ["-r", "0"], ["--size-mib", "0"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_rbench"))
            .arg("membw")
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(String::from_utf8_lossy(&out.stderr).contains("must be > 0"));
    }
}
