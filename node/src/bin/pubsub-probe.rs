//! `pubsub-probe [URL]`: exits 0 when `GET URL` answers 200, else 1. A dependency-free health
//! check for container images that ship no curl (`HEALTHCHECK CMD pubsub-probe`). Without a
//! URL it asks this node's `/ready`, at the address `PUBSUB_LISTEN` names (the node's own
//! setting, so a changed port needs no change to the health check), else `127.0.0.1:8080`.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
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

/// `/ready` of the node listening on `listen` (`PUBSUB_LISTEN`): on loopback when it listens
/// on every address.
fn ready_url(listen: Option<&str>) -> String {
    let addr = listen
        .and_then(|l| l.trim().parse::<SocketAddr>().ok())
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    let ip = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => IpAddr::from([127, 0, 0, 1]),
        ip if ip.is_unspecified() => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/ready", SocketAddr::new(ip, addr.port()))
}

fn main() {
    let url = std::env::args().nth(1).unwrap_or_else(|| ready_url(std::env::var("PUBSUB_LISTEN").ok().as_deref()));
    match probe(&url) {
        Ok(true) => std::process::exit(0),
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("pubsub-probe: {url}: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ready_url;

    #[test]
    fn without_a_url_it_asks_the_address_the_node_listens_on() {
        assert_eq!(ready_url(None), "http://127.0.0.1:8080/ready");
        assert_eq!(ready_url(Some("0.0.0.0:9000")), "http://127.0.0.1:9000/ready");
        assert_eq!(ready_url(Some("[::]:9001")), "http://[::1]:9001/ready");
        assert_eq!(ready_url(Some("10.1.2.3:8081")), "http://10.1.2.3:8081/ready");
        assert_eq!(ready_url(Some("not an address")), "http://127.0.0.1:8080/ready");
    }
}
