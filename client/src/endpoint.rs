//! Node addresses and the URLs of API.md, built in one place.
//!
//! A node is known by its base URL `http://host:port` (no path). Seeds may be given as
//! `host:port`, `http://host:port[/]` or `ws://host:port`; the cluster names nodes by their
//! advertise address `host:port` (`/cluster` `peers`, `leader_address`).

use url::Url;

use crate::error::Error;

/// Where a subscription starts (API.md §5).
///
/// ```
/// use pubsub_client::{Cursor, SubscribeOptions};
///
/// // Replay the whole retained topic, then follow it live.
/// let everything = SubscribeOptions::new("audit").cursor(Cursor::After(0));
/// // Resume where this subscriber's last ack left off.
/// let resume = SubscribeOptions::new("billing").cursor(Cursor::Acked);
/// assert_eq!(SubscribeOptions::new("x").cursor, Cursor::Latest);
/// # let _ = (everything, resume);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cursor {
    /// Only messages committed after subscribing (no `cursor` parameter).
    #[default]
    Latest,
    /// Every message with `sequence > n`; `After(0)` replays the whole retained topic.
    After(u64),
    /// From this subscriber's last recorded ack (`cursor=acked`, 0 when none).
    Acked,
}

/// Parses a server address into a node base URL.
pub(crate) fn parse_base(address: &str) -> Result<Url, Error> {
    let invalid = |reason: &str| Error::InvalidAddress { address: address.to_string(), reason: reason.to_string() };
    let trimmed = address.trim();
    if trimmed.is_empty() {
        return Err(invalid("empty"));
    }
    let with_scheme = if trimmed.contains("://") { trimmed.to_string() } else { format!("http://{trimmed}") };
    let mut url = Url::parse(&with_scheme).map_err(|e| invalid(&e.to_string()))?;
    match url.scheme() {
        "http" => {}
        "ws" => {
            url.set_scheme("http").map_err(|()| invalid("cannot use as http"))?;
        }
        "https" | "wss" => return Err(invalid("TLS is not supported by this client")),
        other => return Err(invalid(&format!("unsupported scheme {other}"))),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    if url.path() != "/" && !url.path().is_empty() {
        return Err(invalid("a server address has no path"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("a server address has no query"));
    }
    url.set_path("/");
    Ok(url)
}

/// The node base of a `Location` header: its scheme, host and port, without the path.
pub(crate) fn base_of_location(location: &str) -> Option<Url> {
    let url = Url::parse(location).ok()?;
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
    parse_base(&format!("{host}:{port}")).ok()
}

/// Refuses `.` and `..` as a topic name or subscriber id in a path: URLs take them (and their
/// percent-encoded forms) for directory steps, so the request would reach another endpoint.
pub(crate) fn check_path_segment(segment: &str) -> Result<(), Error> {
    match segment {
        "." | ".." => Err(Error::InvalidArgument(format!("{segment:?} cannot be a topic name or an id in a URL path"))),
        _ => Ok(()),
    }
}

/// `base` + path segments (each percent-encoded) + query pairs.
pub(crate) fn http_url(base: &Url, segments: &[&str], query: &[(&str, String)]) -> Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.clear().extend(segments);
    }
    if query.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
    }
    url
}

/// `ws://HOST:PORT/topics/:name/subscribe?subscriber_id=S[&cursor=N|acked]`.
pub(crate) fn subscribe_url(base: &Url, topic: &str, subscriber_id: &str, cursor: Cursor) -> Url {
    let mut query = vec![("subscriber_id", subscriber_id.to_string())];
    match cursor {
        Cursor::Latest => {}
        Cursor::After(n) => query.push(("cursor", n.to_string())),
        Cursor::Acked => query.push(("cursor", "acked".to_string())),
    }
    let mut url = http_url(base, &["topics", topic, "subscribe"], &query);
    // http -> ws is allowed by the URL standard (both are special schemes).
    let _ = url.set_scheme("ws");
    url
}

/// `ws://HOST:PORT/topics/:name/publish` (API.md §8).
pub(crate) fn publish_url(base: &Url, topic: &str) -> Url {
    let mut url = http_url(base, &["topics", topic, "publish"], &[]);
    let _ = url.set_scheme("ws");
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(s: &str) -> Url {
        match parse_base(s) {
            Ok(u) => u,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn every_accepted_address_form_gives_the_same_base() {
        for s in ["127.0.0.1:8080", "http://127.0.0.1:8080", "http://127.0.0.1:8080/", " ws://127.0.0.1:8080 "] {
            assert_eq!(base(s).as_str(), "http://127.0.0.1:8080/", "{s}");
        }
        assert_eq!(base("node-2").as_str(), "http://node-2/");
    }

    #[test]
    fn tls_paths_and_empty_addresses_are_refused() {
        for s in ["", "https://h:1", "http://h:1/api", "ftp://h", "http://h:1/?x=1"] {
            assert!(parse_base(s).is_err(), "{s} accepted");
        }
    }

    #[test]
    fn location_header_gives_the_leaders_base() {
        let loc = "http://127.0.0.1:8082/topics/orders/messages?ack=committed";
        assert_eq!(base_of_location(loc).map(|u| u.to_string()), Some("http://127.0.0.1:8082/".to_string()));
        assert_eq!(base_of_location("/relative"), None);
    }

    #[test]
    fn paths_and_queries_are_built_and_topic_names_encoded() {
        let b = base("h:1");
        let url = http_url(&b, &["topics", "orders", "messages"], &[("after", "5".into()), ("limit", "10".into())]);
        assert_eq!(url.as_str(), "http://h:1/topics/orders/messages?after=5&limit=10");
        let odd = http_url(&b, &["topics", "a/b c"], &[]);
        assert_eq!(odd.as_str(), "http://h:1/topics/a%2Fb%20c");
    }

    #[test]
    fn subscribe_url_spells_each_cursor_as_the_contract_says() {
        let b = base("h:1");
        assert_eq!(
            subscribe_url(&b, "t", "s1", Cursor::Latest).as_str(),
            "ws://h:1/topics/t/subscribe?subscriber_id=s1"
        );
        assert_eq!(
            subscribe_url(&b, "t", "s1", Cursor::After(100)).as_str(),
            "ws://h:1/topics/t/subscribe?subscriber_id=s1&cursor=100"
        );
        assert_eq!(
            subscribe_url(&b, "t", "s 1", Cursor::Acked).as_str(),
            "ws://h:1/topics/t/subscribe?subscriber_id=s+1&cursor=acked"
        );
    }

    #[test]
    fn publish_url_is_a_websocket_url_with_the_topic_encoded() {
        assert_eq!(publish_url(&base("h:1"), "orders").as_str(), "ws://h:1/topics/orders/publish");
        assert_eq!(publish_url(&base("h:1"), "a b").as_str(), "ws://h:1/topics/a%20b/publish");
    }

    #[test]
    fn dot_segments_are_refused_before_any_url_is_built() {
        for dots in [".", ".."] {
            assert!(matches!(check_path_segment(dots), Err(Error::InvalidArgument(_))), "{dots}");
        }
        for fine in ["...", ".a", "a.", "orders.v1"] {
            assert!(check_path_segment(fine).is_ok(), "{fine}");
        }
        // What a dot segment would have become: another endpoint.
        assert_eq!(http_url(&base("h:1"), &["topics", "..", "messages"], &[]).path(), "/topics/messages");
    }
}
