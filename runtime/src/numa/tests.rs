use super::*;

/// A fake sysfs root with the given nodes (id, cpulist, distance line; "" cpulist for a
/// memory-only node) and a status file with the allowed lists.
fn fake(nodes: &[(usize, &str, &str)], cpus: &str, mems: &str) -> (tempfile::TempDir, Topology) {
    let d = tempfile::tempdir().unwrap();
    for (id, cpulist, dist) in nodes {
        let n = d.path().join(format!("sys/devices/system/node/node{id}"));
        std::fs::create_dir_all(&n).unwrap();
        std::fs::write(n.join("cpulist"), format!("{cpulist}\n")).unwrap();
        std::fs::write(n.join("distance"), format!("{dist}\n")).unwrap();
        std::fs::write(
            n.join("meminfo"),
            format!("Node {id} MemTotal:  1000 kB\nNode {id} MemFree:  600 kB\n"),
        )
        .unwrap();
    }
    // Files that are not nodes must be ignored.
    std::fs::create_dir_all(d.path().join("sys/devices/system/node/power")).unwrap();
    std::fs::write(d.path().join("sys/devices/system/node/possible"), "0-3\n").unwrap();
    let status = d.path().join("status");
    std::fs::write(
        &status,
        format!(
            "Name:\tx\nCpus_allowed:\tff\nCpus_allowed_list:\t{cpus}\nMems_allowed_list:\t{mems}\n"
        ),
    )
    .unwrap();
    let t = Topology::read_from(&d.path().join("sys"), &status).unwrap();
    (d, t)
}

#[test]
fn lists_parse_and_format() {
    assert_eq!(
        parse_list("0-3,8,10-11\n"),
        Some(vec![0, 1, 2, 3, 8, 10, 11])
    );
    assert_eq!(parse_list(""), Some(vec![]));
    assert_eq!(parse_list("3,1,1"), Some(vec![1, 3]));
    assert_eq!(parse_list("4-2"), None);
    assert_eq!(parse_list("x"), None);
    assert_eq!(format_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    assert_eq!(format_list(&[]), "");
}

#[test]
fn one_node_and_no_numa_kernel() {
    let (_d, t) = fake(&[(0, "0-3", "10")], "0-3", "0");
    assert_eq!(t.n_nodes(), 1);
    assert_eq!(t.nodes[0].mem_total_kib, Some(1000));
    assert_eq!(t.nodes[0].mem_free_kib, Some(600));
    let p = plan_threads(&t, Some(NumaMode::Distribute), 3, Some(2)).unwrap();
    assert_eq!(p.cpus, Some(vec![0, 1, 2]));
    assert_eq!(p.nodes, vec![0, 0, 0]);

    // No node directory at all: one node with the allowed CPUs.
    let d = tempfile::tempdir().unwrap();
    let status = d.path().join("status");
    std::fs::write(&status, "Cpus_allowed_list:\t1,3\n").unwrap();
    let t = Topology::read_from(d.path(), &status).unwrap();
    assert_eq!(t.n_nodes(), 1);
    assert_eq!(t.nodes[0].cpus, vec![1, 3]);
    assert_eq!(t.allowed_mems, vec![0]);
}

#[test]
fn two_nodes_distribute_isolate_numactl() {
    let (_d, t) = fake(&[(0, "0-3", "10 21"), (1, "4-7", "21 10")], "0-7", "0-1");
    assert_eq!(t.nodes[1].distances, vec![21, 10]);
    let p = plan_threads(&t, Some(NumaMode::Distribute), 4, None).unwrap();
    assert_eq!(p.cpus, Some(vec![0, 4, 1, 5]));
    assert_eq!(p.nodes, vec![0, 1, 0, 1]);
    assert_eq!(p.caller_mask, Some(vec![0, 1, 2, 3]));
    assert_eq!(plan_threads(&t, None, 4, None).unwrap().caller_mask, None);
    // Isolate: the node the process runs on.
    let p = plan_threads(&t, Some(NumaMode::Isolate), 3, Some(6)).unwrap();
    assert_eq!(p.cpus, Some(vec![4, 5, 6]));
    assert_eq!(p.nodes, vec![1, 1, 1]);
    // The (unpinned) caller stays on its node too.
    assert_eq!(p.caller_mask, Some(vec![4, 5, 6, 7]));
    // More threads than the node has: confined to the node, not pinned.
    let p = plan_threads(&t, Some(NumaMode::Isolate), 5, Some(0)).unwrap();
    assert_eq!(p.cpus, None);
    assert!(p.masks.iter().all(|m| m == &vec![0, 1, 2, 3]));
    // Numactl and the default: the allowed CPUs in order.
    let p = plan_threads(&t, Some(NumaMode::Numactl), 5, None).unwrap();
    assert_eq!(p.cpus, Some(vec![0, 1, 2, 3, 4]));
    assert_eq!(p.nodes, vec![0, 0, 0, 0, 1]);
    assert_eq!(plan_threads(&t, None, 5, None).unwrap(), p);
    // Oversubscribed distribute still alternates nodes.
    let p = plan_threads(&t, Some(NumaMode::Distribute), 10, None).unwrap();
    assert_eq!(p.cpus, None);
    assert_eq!(p.nodes, vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
}

#[test]
fn numactl_limits_are_honoured() {
    // `numactl --cpunodebind=1 --membind=1`: only node 1's CPUs and memory.
    let (_d, t) = fake(&[(0, "0-3", "10 21"), (1, "4-7", "21 10")], "4-7", "1");
    let p = plan_threads(&t, Some(NumaMode::Distribute), 2, None).unwrap();
    assert_eq!(p.cpus, Some(vec![4, 5]));
    assert_eq!(t.cpu_nodes(), vec![1]);
    assert_eq!(t.replica_nodes(&p), vec![1]);
    // `numactl --membind=1` alone leaves Mems_allowed whole; the policy narrows it.
    let (_d, mut t2) = fake(&[(0, "0-3", "10 21"), (1, "4-7", "21 10")], "0-7", "0-1");
    assert_eq!(t2.usable_mems(), vec![0, 1]);
    t2.policy_mems = Some(vec![1]);
    assert_eq!(t2.usable_mems(), vec![1]);
    assert_eq!(
        weight_nodes(&t2, WeightPlacement::Interleave, None, 2).unwrap(),
        vec![1]
    );
    let p2 = plan_threads(&t2, Some(NumaMode::Distribute), 2, None).unwrap();
    assert_eq!(t2.replica_nodes(&p2), vec![1]);
    // Isolate from a CPU we may not use falls back to its node only if allowed.
    let e = plan_threads(&t, Some(NumaMode::Isolate), 2, Some(1)).unwrap_err();
    assert!(e.to_string().contains("node 0 has no CPU"), "{e}");
    // taskset 1,5: one CPU per node.
    let (_d, t) = fake(&[(0, "0-3", "10 21"), (1, "4-7", "21 10")], "1,5", "0-1");
    let p = plan_threads(&t, Some(NumaMode::Distribute), 2, None).unwrap();
    assert_eq!(p.cpus, Some(vec![1, 5]));
    assert_eq!(t.replica_nodes(&p), vec![0, 1]);
}

#[test]
fn four_nodes_with_holes_and_a_memory_only_node() {
    let (_d, t) = fake(
        &[
            (0, "0-1,8-9", "10 16 16 16"),
            (1, "2-3,10-11", "16 10 16 16"),
            (2, "", "16 16 10 16"),
            (4, "4-5", "16 16 16 10"),
        ],
        "0-5,8-11",
        "0-2,4",
    );
    assert_eq!(t.n_nodes(), 4);
    assert_eq!(t.nodes[3].id, 4);
    assert_eq!(t.nodes[2].cpus, Vec::<usize>::new());
    assert_eq!(t.cpu_nodes(), vec![0, 1, 4]);
    assert_eq!(t.node_of_cpu(10), Some(1));
    assert_eq!(t.node_of_cpu(6), None);
    let p = plan_threads(&t, Some(NumaMode::Distribute), 7, None).unwrap();
    assert_eq!(p.cpus, Some(vec![0, 2, 4, 1, 3, 5, 8]));
    assert_eq!(p.nodes, vec![0, 1, 4, 0, 1, 4, 0]);
    // The memory-only node gets no replica (no thread runs there).
    assert_eq!(t.replica_nodes(&p), vec![0, 1, 4]);
}

#[test]
fn bad_files_give_errors_naming_them() {
    let d = tempfile::tempdir().unwrap();
    let e = Topology::read_from(d.path(), &d.path().join("missing")).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
    let status = d.path().join("status");
    std::fs::write(&status, "Cpus_allowed_list:\tzz\n").unwrap();
    let e = Topology::read_from(d.path(), &status).unwrap_err();
    assert!(e.to_string().contains("Cpus_allowed_list"), "{e}");
    let n = d.path().join("devices/system/node/node0");
    std::fs::create_dir_all(&n).unwrap();
    std::fs::write(&status, "Cpus_allowed_list:\t0\n").unwrap();
    std::fs::write(n.join("cpulist"), "0-\n").unwrap();
    let e = Topology::read_from(d.path(), &status).unwrap_err();
    assert!(e.to_string().contains("cpulist"), "{e}");
}

#[test]
fn names_round_trip() {
    for n in NumaMode::NAMES {
        assert_eq!(n.parse::<NumaMode>().unwrap().name(), n);
    }
    for n in WeightPlacement::NAMES {
        assert_eq!(n.parse::<WeightPlacement>().unwrap().name(), n);
    }
    assert!("mirror".parse::<NumaMode>().is_err());
    assert!("spread".parse::<WeightPlacement>().is_err());
}

#[cfg(target_os = "linux")]
#[test]
fn real_machine_pages_are_found_where_they_are() {
    let t = Topology::read().unwrap();
    assert!(!t.allowed_cpus.is_empty());
    let node = t.allowed_mems[0];
    let src = vec![7u8; 64 * page_size()];
    let m = NodeMemory::copy_of(&src, Policy::Bind(node)).unwrap();
    assert_eq!(m.bytes(), &src[..]);
    let p = m.placement();
    assert_eq!(p.per_node.get(&node), Some(&64), "{p:?}");
    assert_eq!(p.total(), 64);
    let i = NodeMemory::copy_of(&src, Policy::Interleave(t.allowed_mems.clone())).unwrap();
    assert_eq!(i.placement().per_node.values().sum::<u64>(), 64);
    // A node that does not exist is refused with the kernel's reason.
    assert!(NodeMemory::copy_of(&src, Policy::Bind(1000)).is_err());
    // Untouched anonymous pages are reported absent, not on a node.
    let mut v: Vec<u8> = Vec::with_capacity(16 << 20);
    let p = page_placement(v.as_mut_ptr(), 16 << 20);
    assert!(p.absent > 0, "{p:?}");
}
