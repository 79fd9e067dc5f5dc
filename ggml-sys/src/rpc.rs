//! ggml's RPC backend, as far as it can be checked from outside ggml.
//!
//! ggml's RPC client aborts the process when a server cannot be reached or speaks another
//! protocol version (`GGML_ABORT` in its connect path), and its protocol has no
//! authentication: anyone who reaches a server can run graphs on it and read or write its
//! memory. So every endpoint is checked here before ggml sees it: the address must be on
//! this machine or a private network unless the caller allows public ones, and the server
//! must answer ggml's HELLO with a version this ggml speaks. This module needs no ggml: it
//! speaks the handshake itself (one command, `RPC_CMD_HELLO`, whose framing the protocol
//! keeps fixed across versions).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// `RPC_CMD_HELLO`: the protocol fixes it at 14 in every version.
const CMD_HELLO: u8 = 14;
/// Transport capabilities exchanged in HELLO (`RPC_CONN_CAPS_SIZE`); zeros ask for plain
/// TCP.
const CONN_CAPS: usize = 24;

/// The RPC protocol version of this build's ggml, `(major, minor, patch)`.
pub fn proto_version() -> Option<(u8, u8, u8)> {
    let v = option_env!("GGML_SYS_RPC_PROTO")?;
    let mut it = v.split('.').map(|p| p.parse::<u8>().ok());
    Some((it.next()??, it.next()??, it.next()??))
}

/// Loopback, private (RFC 1918, shared address space, IPv6 unique local) and link-local
/// addresses: those a ggml RPC server may be reached at without `--rpc-allow-public`.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v) => {
            let o = v.octets();
            v.is_loopback()
                || v.is_private()
                || v.is_link_local()
                // 100.64.0.0/10, shared address space (carrier-grade NAT, tailnets).
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
        }
        IpAddr::V6(v) => {
            let s = v.segments();
            v.is_loopback()
                || (s[0] & 0xfe00) == 0xfc00 // fc00::/7, unique local
                || (s[0] & 0xffc0) == 0xfe80 // fe80::/10, link-local
                || v.to_ipv4_mapped().is_some_and(|m| is_private(IpAddr::V4(m)))
        }
    }
}

/// `HOST:PORT` as ggml parses it (the host is everything before the first `:`, so no IPv6
/// literal), resolved.
pub fn resolve(endpoint: &str) -> Result<Vec<SocketAddr>, String> {
    let (host, port) = endpoint
        .split_once(':')
        .ok_or_else(|| format!("RPC server {endpoint:?}: not HOST:PORT"))?;
    if host.is_empty() || port.contains(':') {
        return Err(format!(
            "RPC server {endpoint:?}: not HOST:PORT (ggml's RPC takes no IPv6 literal)"
        ));
    }
    let port: u16 = port.parse().ok().filter(|&p| p > 0).ok_or_else(|| {
        format!("RPC server {endpoint:?}: the port is not a number from 1 to 65535")
    })?;
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("RPC server {endpoint:?}: {host} does not resolve: {e}"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("RPC server {endpoint:?}: {host} has no address"));
    }
    Ok(addrs)
}

/// Refuses an endpoint any of whose addresses is public, unless `allow_public`.
pub fn check_private(
    endpoint: &str,
    addrs: &[SocketAddr],
    allow_public: bool,
) -> Result<(), String> {
    if allow_public {
        return Ok(());
    }
    match addrs.iter().find(|a| !is_private(a.ip())) {
        Some(a) => Err(format!(
            "RPC server {endpoint:?} is at {}, a public address: ggml's RPC protocol has no \
             authentication or encryption (whoever reaches a server can run code-like graphs \
             on it and read its memory), so rllama connects only to loopback and private \
             addresses unless --rpc-allow-public is given",
            a.ip()
        )),
        None => Ok(()),
    }
}

/// Connects to a ggml RPC server, says HELLO as ggml's client does, and returns the
/// server's protocol version.
pub fn hello(
    endpoint: &str,
    addrs: &[SocketAddr],
    timeout: Duration,
) -> Result<(u8, u8, u8), String> {
    let mut last = String::new();
    for a in addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(mut s) => {
                s.set_read_timeout(Some(timeout))
                    .map_err(|e| e.to_string())?;
                s.set_write_timeout(Some(timeout))
                    .map_err(|e| e.to_string())?;
                let mut req = Vec::with_capacity(1 + 8 + CONN_CAPS);
                req.push(CMD_HELLO);
                req.extend_from_slice(&(CONN_CAPS as u64).to_le_bytes());
                req.extend_from_slice(&[0u8; CONN_CAPS]);
                let io = |e: std::io::Error| {
                    format!(
                        "RPC server {endpoint:?} ({a}) did not answer ggml's handshake ({e}): \
                         not a ggml RPC server, or one busy with another client"
                    )
                };
                s.write_all(&req).map_err(io)?;
                let mut size = [0u8; 8];
                s.read_exact(&mut size).map_err(io)?;
                let size = u64::from_le_bytes(size);
                if !(3..=4096).contains(&size) {
                    return Err(format!(
                        "RPC server {endpoint:?} ({a}) answered the handshake with {size} bytes: \
                         not a ggml RPC server this build understands"
                    ));
                }
                let mut body = vec![0u8; size as usize];
                s.read_exact(&mut body).map_err(io)?;
                return Ok((body[0], body[1], body[2]));
            }
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(format!(
        "RPC server {endpoint:?} cannot be reached ({last})"
    ))
}

/// Everything checked before ggml may connect: the address (private unless allowed),
/// and a server that answers with a protocol version this ggml speaks (same major, minor
/// no newer: ggml's own rule, which it enforces by aborting).
pub fn check_endpoint(endpoint: &str, allow_public: bool, timeout: Duration) -> Result<(), String> {
    let addrs = resolve(endpoint)?;
    check_private(endpoint, &addrs, allow_public)?;
    let theirs = hello(endpoint, &addrs, timeout)?;
    if let Some(ours) = proto_version() {
        if theirs.0 != ours.0 || theirs.1 > ours.1 {
            return Err(format!(
                "RPC server {endpoint:?} speaks RPC protocol {}.{}.{}, this build's ggml {}.{}.{}: \
                 run an rpc-server built from the same ggml (rllama rpc-server)",
                theirs.0, theirs.1, theirs.2, ours.0, ours.1, ours.2
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_and_public_addresses() {
        for p in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.3.4",
            "100.64.0.1",
            "100.127.255.255",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_private(p.parse().unwrap()), "{p}");
        }
        for p in [
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "1.1.1.1",
            "2001:db8::1",
            "0.0.0.0",
            "::ffff:8.8.8.8",
        ] {
            assert!(!is_private(p.parse().unwrap()), "{p}");
        }
    }

    #[test]
    fn endpoints_parse_as_ggml_parses_them() {
        assert_eq!(resolve("127.0.0.1:50052").unwrap()[0].port(), 50052);
        for bad in [
            "127.0.0.1",
            ":50052",
            "127.0.0.1:x",
            "127.0.0.1:0",
            "[::1]:50052",
            "::1:5",
        ] {
            assert!(resolve(bad).is_err(), "{bad}");
        }
        let a = resolve("8.8.8.8:50052").unwrap();
        let e = check_private("8.8.8.8:50052", &a, false).unwrap_err();
        assert!(e.contains("--rpc-allow-public"), "{e}");
        assert!(check_private("8.8.8.8:50052", &a, true).is_ok());
    }

    #[test]
    fn hello_reads_the_version_and_refuses_what_is_not_a_server() {
        use std::net::TcpListener;
        // A stand-in server: checks the request's framing, answers version 7.0.0.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = [0u8; 1 + 8 + CONN_CAPS];
            s.read_exact(&mut req).unwrap();
            assert_eq!(req[0], CMD_HELLO);
            assert_eq!(
                u64::from_le_bytes(req[1..9].try_into().unwrap()),
                CONN_CAPS as u64
            );
            let mut rsp = (4 + CONN_CAPS as u64).to_le_bytes().to_vec();
            rsp.extend_from_slice(&[7, 0, 0, 0]);
            rsp.extend_from_slice(&[0; CONN_CAPS]);
            s.write_all(&rsp).unwrap();
        });
        let ep = format!("127.0.0.1:{port}");
        let a = resolve(&ep).unwrap();
        assert_eq!(hello(&ep, &a, Duration::from_secs(5)).unwrap(), (7, 0, 0));
        t.join().unwrap();
        // A server that says nothing: a timeout with the reason, not a hang.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ep = format!("127.0.0.1:{}", l.local_addr().unwrap().port());
        let a = resolve(&ep).unwrap();
        let e = hello(&ep, &a, Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("did not answer"), "{e}");
        drop(l);
        // Nothing listening.
        let e = hello(&ep, &a, Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("cannot be reached"), "{e}");
    }
}
