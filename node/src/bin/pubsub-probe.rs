//! `pubsub-probe URL`: exits 0 when `GET URL` answers 200, else 1. A dependency-free health
//! check for container images that ship no curl (`HEALTHCHECK CMD pubsub-probe
//! http://127.0.0.1:8080/ready`).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

fn probe(url: &str) -> Result<bool, String> {
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs are supported")?;
    let (host_port, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = host_port.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("address did not resolve")?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host_port}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).map_err(|e| e.to_string())?;
    Ok(&head[9..12] == b"200")
}

fn main() {
    let url = std::env::args().nth(1).unwrap_or_else(|| "http://127.0.0.1:8080/ready".into());
    match probe(&url) {
        Ok(true) => std::process::exit(0),
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("pubsub-probe: {url}: {e}");
            std::process::exit(1);
        }
    }
}
