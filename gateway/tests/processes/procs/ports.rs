//! Loopback ports for servers a test starts later.

/// A loopback port free for both TCP and UDP, for a server a test starts later. Taken from
/// below the kernel's ephemeral range (32768–60999 on Linux): a port from `bind(0)` was handed
/// back to the pool when the probe closed, and an outgoing connection of a test running
/// alongside could take it before the server bound it ("address already in use"). Never the
/// same port twice in one test process; the start depends on the process id.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let start = std::process::id().wrapping_mul(7_919);
    loop {
        let port = (FIRST + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        if tcp.is_ok() && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
