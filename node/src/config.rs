//! Command-line flags (each with an environment twin) and their validation (API.md §0).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::Parser;

use crate::limits::{
    ELECTION_TIMEOUT_MS_DEFAULT, ELECTION_TIMEOUT_MS_MAX, HEARTBEAT_MS_DEFAULT, MIN_FREE_BYTES_DEFAULT,
    SNAPSHOT_LOGS_DEFAULT, SNAPSHOT_LOGS_MAX,
};

/// `pubsub-node`: one node of a Raft-replicated pub/sub cluster. With no flags it is a
/// working single-node cluster on port 8080.
#[derive(Debug, Clone, Parser)]
#[command(name = "pubsub-node", version, about)]
pub struct Flags {
    /// Numeric Raft node id (u64 ≥ 1); shown as "node-N".
    #[arg(long, env = "PUBSUB_ID", default_value_t = 1)]
    pub id: u64,

    /// Address to listen on: client API, subscriptions and Raft RPC share it.
    #[arg(long, env = "PUBSUB_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// HOST:PORT of a node started without --peers (its one-voter cluster records it); with
    /// --peers it may only repeat this node's entry [default: that entry, else
    /// 127.0.0.1:PORT with the port of --listen].
    #[arg(long, env = "PUBSUB_ADVERTISE")]
    pub advertise: Option<String>,

    /// Where RocksDB, the Raft log's segment files and snapshots live [default: ./data/node-ID].
    #[arg(long, env = "PUBSUB_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Initial voters, this node included: ID=HOST:PORT,... [default: this node alone].
    #[arg(long, env = "PUBSUB_PEERS")]
    pub peers: Option<String>,

    /// Where clients reach each node, when not at its --peers address (behind port mapping or
    /// NAT, as with docker compose): ID=HOST:PORT,... the same on every node. Redirects,
    /// /cluster and leader_change frames name these; Raft keeps using --peers
    /// [default: the --peers addresses].
    #[arg(long, env = "PUBSUB_CLIENT_ADDRESSES")]
    pub client_addresses: Option<String>,

    /// Shared secret every inter-node RPC must present.
    #[arg(long, env = "PUBSUB_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,

    /// Raft heartbeat interval in milliseconds.
    #[arg(long, env = "PUBSUB_HEARTBEAT_MS", default_value_t = HEARTBEAT_MS_DEFAULT)]
    pub heartbeat_ms: u64,

    /// Minimum election timeout in milliseconds (the maximum is twice this).
    #[arg(long, env = "PUBSUB_ELECTION_TIMEOUT_MS", default_value_t = ELECTION_TIMEOUT_MS_DEFAULT)]
    pub election_timeout_ms: u64,

    /// Build a snapshot (letting the log be purged) every this many log entries.
    #[arg(long, env = "PUBSUB_SNAPSHOT_LOGS", default_value_t = SNAPSHOT_LOGS_DEFAULT)]
    pub snapshot_logs: u64,

    /// Bytes the data dir keeps free, besides its newest snapshot's size: while the leader's
    /// (or, as another node tells it, that node's) has less available, publishes and topic
    /// creations are refused with 507 insufficient_storage (deletes, acks and retention still
    /// run). 0 turns the check off.
    #[arg(long, env = "PUBSUB_MIN_FREE_BYTES", default_value_t = MIN_FREE_BYTES_DEFAULT)]
    pub min_free_bytes: u64,

    /// Join a running cluster: never initialize one, even on an empty data dir, and wait for
    /// its leader to add this node (POST /cluster/members on any node).
    #[arg(long, env = "PUBSUB_JOIN", value_parser = BoolishValueParser::new())]
    pub join: bool,

    /// Disaster recovery, when a majority of the voters are lost for good: make this node the
    /// only voter of its cluster, keeping its data (writes acknowledged by the lost nodes alone
    /// are gone), then add new nodes with --join. For one start only: refused on a data dir it
    /// was already used on.
    #[arg(long, env = "PUBSUB_FORCE_NEW_CLUSTER", value_parser = BoolishValueParser::new())]
    pub force_new_cluster: bool,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub id: u64,
    pub listen: SocketAddr,
    pub advertise: String,
    /// `advertise` is a guess (`127.0.0.1` and the listen port): neither `--advertise` nor a
    /// `--peers` entry named this node's address. The address the cluster recorded for the
    /// node, if any, is the one to keep then (`--force-new-cluster`).
    pub advertise_guessed: bool,
    pub data_dir: PathBuf,
    /// Initial voters by id (this node included).
    pub peers: BTreeMap<u64, String>,
    /// Client-facing addresses by id, where they differ from the Raft ones (`--client-addresses`).
    pub client_addresses: BTreeMap<u64, String>,
    pub cluster_secret: Option<String>,
    pub heartbeat_ms: u64,
    pub election_timeout_ms: u64,
    pub snapshot_logs: u64,
    /// Bytes the data dir keeps available (`--min-free-bytes`; 0: not checked).
    pub min_free_bytes: u64,
    /// How log appends are fsynced (a syncer thread in production; inline in the simulation).
    pub io_mode: raft_store::IoMode,
    /// `--join`: this node waits to be added to a running cluster and never initializes one.
    pub join: bool,
    /// `--force-new-cluster`: this start makes the node the only voter of its cluster.
    pub force_new_cluster: bool,
}

/// A configuration error, printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--id must be at least 1")]
    ZeroId,
    #[error("--peers: {0}")]
    Peers(String),
    #[error("--id {id} is not in --peers ({peers})")]
    IdNotInPeers { id: u64, peers: String },
    #[error("--client-addresses: {0}")]
    ClientAddresses(String),
    #[error("--advertise {0:?} is not HOST:PORT")]
    Advertise(String),
    #[error(
        "--listen on port 0 needs --advertise or --peers: peers and clients must be told a port to reach this node at"
    )]
    ListenPortZero,
    #[error("--advertise {advertise:?} is not this node's --peers entry {peer:?}: leave it out, or make them one (--client-addresses names where clients reach a node)")]
    AdvertiseNotPeer { advertise: String, peer: String },
    #[error(
        "--heartbeat-ms must be at least 1 and --election-timeout-ms at least 3 times it, at most {ELECTION_TIMEOUT_MS_MAX}"
    )]
    Timings,
    #[error("--snapshot-logs must be at least 1 and at most {SNAPSHOT_LOGS_MAX}")]
    SnapshotLogs,
    #[error(
        "--cluster-secret must be printable ASCII with no space or newline at either end: it travels in an HTTP header"
    )]
    ClusterSecret,
}

impl Config {
    pub fn from_flags(flags: Flags) -> Result<Self, ConfigError> {
        if flags.id == 0 {
            return Err(ConfigError::ZeroId);
        }
        // The bound keeps `3 * heartbeat` and twice the timeout (its maximum draw) from
        // overflowing.
        if flags.heartbeat_ms == 0
            || flags.election_timeout_ms > ELECTION_TIMEOUT_MS_MAX
            || flags.election_timeout_ms < 3 * flags.heartbeat_ms.min(ELECTION_TIMEOUT_MS_MAX)
        {
            return Err(ConfigError::Timings);
        }
        if !(1..=SNAPSHOT_LOGS_MAX).contains(&flags.snapshot_logs) {
            return Err(ConfigError::SnapshotLogs);
        }
        let cluster_secret = flags.cluster_secret.filter(|s| !s.is_empty());
        // Refused here, not at the first dial: a secret read from a file with its newline
        // could not be sent, and one with other characters would not compare equal on the
        // peer, so the node would run without ever reaching a peer.
        let header_safe = |s: &str| s.bytes().all(|b| (b' '..=b'~').contains(&b)) && s.trim() == s;
        if cluster_secret.as_deref().is_some_and(|s| !header_safe(s)) {
            return Err(ConfigError::ClusterSecret);
        }
        let peers = match &flags.peers {
            Some(text) if !text.trim().is_empty() => parse_peers(text)?,
            _ => BTreeMap::new(),
        };
        let advertise_guessed = flags.advertise.is_none() && !peers.contains_key(&flags.id);
        let advertise = match (&flags.advertise, peers.get(&flags.id)) {
            // Peers dial the `--peers` entry and every node names it in redirects: another
            // address here would be what this node alone says of itself.
            (Some(a), Some(p)) if a != p => {
                return Err(ConfigError::AdvertiseNotPeer { advertise: a.clone(), peer: p.clone() })
            }
            (Some(a), _) => a.clone(),
            (None, Some(p)) => p.clone(),
            (None, None) if flags.listen.port() == 0 => return Err(ConfigError::ListenPortZero),
            (None, None) => format!("127.0.0.1:{}", flags.listen.port()),
        };
        if !is_host_port(&advertise) {
            return Err(ConfigError::Advertise(advertise));
        }
        let peers = if peers.is_empty() {
            BTreeMap::from([(flags.id, advertise.clone())])
        } else if !peers.contains_key(&flags.id) {
            return Err(ConfigError::IdNotInPeers { id: flags.id, peers: flags.peers.unwrap_or_default() });
        } else {
            peers
        };
        let client_addresses = match &flags.client_addresses {
            Some(text) if !text.trim().is_empty() => parse_peers(text).map_err(|e| match e {
                ConfigError::Peers(reason) => ConfigError::ClientAddresses(reason),
                other => other,
            })?,
            _ => BTreeMap::new(),
        };
        // Entries for nodes outside --peers are kept: nodes added later through
        // /cluster/members, and on a node started with --join, the cluster it joins.
        Ok(Self {
            id: flags.id,
            listen: flags.listen,
            data_dir: flags.data_dir.unwrap_or_else(|| PathBuf::from(format!("./data/node-{}", flags.id))),
            advertise_guessed,
            advertise,
            peers,
            client_addresses,
            cluster_secret,
            heartbeat_ms: flags.heartbeat_ms,
            election_timeout_ms: flags.election_timeout_ms,
            snapshot_logs: flags.snapshot_logs,
            min_free_bytes: flags.min_free_bytes,
            io_mode: raft_store::IoMode::Background,
            join: flags.join,
            force_new_cluster: flags.force_new_cluster,
        })
    }

    /// The node that initializes a fresh cluster: the smallest id in `--peers`, unless it was
    /// started to `--join` a running one.
    pub fn is_bootstrapper(&self) -> bool {
        !self.join && self.peers.keys().next() == Some(&self.id)
    }
}

/// `HOST:PORT` where HOST is a name or IPv4 address, or an IPv6 address in brackets: what the
/// node puts after `ws://` and `http://`. Checked at start-up because a bootstrapper stores the
/// addresses in its log, and a bad one would be dialled, and fail, for the cluster's life.
pub fn is_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(ipv6) => ipv6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')),
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}

/// A node id as `N` or `node-N`, N ≥ 1; the error says why not.
pub fn parse_node_id(text: &str) -> Result<u64, String> {
    match text.trim().trim_start_matches("node-").parse::<u64>() {
        Ok(0) => Err("node ids start at 1".into()),
        Ok(id) => Ok(id),
        Err(_) => Err(format!("{text:?} is not a node id")),
    }
}

/// Parses `ID=HOST:PORT,...`.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    let mut peers: BTreeMap<u64, String> = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) =
            part.split_once('=').ok_or_else(|| ConfigError::Peers(format!("{part:?} is not ID=HOST:PORT")))?;
        let id = parse_node_id(id).map_err(ConfigError::Peers)?;
        let addr = addr.trim();
        if !is_host_port(addr) {
            return Err(ConfigError::Peers(format!("{addr:?} is not HOST:PORT")));
        }
        if peers.contains_key(&id) {
            return Err(ConfigError::Peers(format!("node {id} is listed twice")));
        }
        // Two ids at one address would make a voter that is never there: dials to it reach
        // the other node, and the cluster, once stored with it, never has its quorum.
        if let Some((other, _)) = peers.iter().find(|(_, a)| a.as_str() == addr) {
            return Err(ConfigError::Peers(format!("nodes {other} and {id} are both at {addr}")));
        }
        peers.insert(id, addr.to_string());
    }
    if peers.is_empty() {
        return Err(ConfigError::Peers("no peers listed".into()));
    }
    Ok(peers)
}

/// Refuses `--peers` that mix loopback addresses with others: a node on another host cannot
/// dial a peer at 127.0.0.1, so the cluster would elect a leader that node never hears, or
/// none. The membership API refuses the same mix. Asked only of a node whose log is empty
/// (`lib.rs`): a cluster already formed so (on one host, or before this check) still starts.
pub fn refuse_mixed_loopback(peers: &BTreeMap<u64, String>) -> Result<(), ConfigError> {
    let loopback = peers.iter().find(|(_, addr)| is_loopback(addr));
    let elsewhere = peers.iter().find(|(_, addr)| !is_loopback(addr));
    match (loopback, elsewhere) {
        (Some((near, near_addr)), Some((far, far_addr))) => Err(ConfigError::Peers(format!(
            "node {near} is at {near_addr}, a loopback address, and node {far} at {far_addr}, which is not: a \
             node at {far_addr} could not reach {near_addr}; give every node an address the others reach"
        ))),
        _ => Ok(()),
    }
}

/// Whether a `HOST:PORT` address names this host's loopback (`localhost`, 127.0.0.0/8, `[::1]`).
pub fn is_loopback(address: &str) -> bool {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut all = vec!["pubsub-node"];
        all.extend_from_slice(args);
        Flags::try_parse_from(all).expect("flags parse")
    }

    #[test]
    fn no_flags_is_a_single_node_cluster_on_8080() {
        let c = Config::from_flags(flags(&[])).unwrap();
        assert_eq!(c.id, 1);
        assert_eq!(c.advertise, "127.0.0.1:8080");
        assert_eq!(c.peers, BTreeMap::from([(1, "127.0.0.1:8080".to_string())]));
        assert_eq!(c.data_dir, PathBuf::from("./data/node-1"));
        assert!(c.is_bootstrapper());
    }

    #[test]
    fn a_cluster_secret_that_cannot_travel_in_a_header_is_refused() {
        for bad in ["s3cret\n", " s3cret", "s3cret ", "sécret", "a\tb"] {
            let refused = Config::from_flags(flags(&["--cluster-secret", bad]));
            assert!(matches!(refused, Err(ConfigError::ClusterSecret)), "{bad:?}");
        }
        for fine in ["s3cret", "two words", "!~#$%"] {
            let c = Config::from_flags(flags(&["--cluster-secret", fine])).unwrap();
            assert_eq!(c.cluster_secret.as_deref(), Some(fine));
        }
        assert_eq!(Config::from_flags(flags(&["--cluster-secret", ""])).unwrap().cluster_secret, None);
    }

    #[test]
    fn client_addresses_are_host_port_by_node_id() {
        let peers = ["--id", "2", "--peers", "1=a:1,2=b:2,3=c:3"];
        let c =
            Config::from_flags(flags(&[&peers[..], &["--client-addresses", "1=h:8081,2=h:8082"]].concat())).unwrap();
        assert_eq!(c.client_addresses, BTreeMap::from([(1, "h:8081".to_string()), (2, "h:8082".to_string())]));
        assert!(Config::from_flags(flags(&peers)).unwrap().client_addresses.is_empty());
        // A node added later, not in --peers.
        let later = Config::from_flags(flags(&[&peers[..], &["--client-addresses", "4=h:8084"]].concat())).unwrap();
        assert_eq!(later.client_addresses, BTreeMap::from([(4, "h:8084".to_string())]));
        for bad in ["1=nohost", "x=h:1", "1=h:1,1=h:2"] {
            let refused = Config::from_flags(flags(&[&peers[..], &["--client-addresses", bad]].concat()));
            assert!(matches!(refused, Err(ConfigError::ClientAddresses(_))), "{bad}: {refused:?}");
        }
    }

    #[test]
    fn a_joining_node_never_initializes_a_cluster() {
        let alone = Config::from_flags(flags(&["--id", "4", "--advertise", "h:4", "--join"])).unwrap();
        assert_eq!(alone.peers, BTreeMap::from([(4, "h:4".to_string())]));
        assert!(alone.join && !alone.is_bootstrapper(), "alone in its --peers, it would have started a cluster");
        let first = Config::from_flags(flags(&["--id", "1", "--peers", "1=a:1,2=b:2", "--join"])).unwrap();
        assert!(!first.is_bootstrapper());
    }

    #[test]
    fn node_ids_are_n_or_node_n_from_1() {
        assert_eq!(parse_node_id("4"), Ok(4));
        assert_eq!(parse_node_id(" node-12 "), Ok(12));
        for bad in ["0", "node-0", "", "node-", "x", "-1", "4.0"] {
            assert!(parse_node_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn listening_on_port_0_needs_an_address_to_advertise() {
        let refused = Config::from_flags(flags(&["--listen", "127.0.0.1:0"]));
        assert!(matches!(refused, Err(ConfigError::ListenPortZero)), "{refused:?}");
        let c = Config::from_flags(flags(&["--listen", "127.0.0.1:0", "--advertise", "h:9"])).unwrap();
        assert_eq!(c.advertise, "h:9");
    }

    #[test]
    fn advertise_defaults_to_this_nodes_peer_entry() {
        let c = Config::from_flags(flags(&["--id", "2", "--peers", "1=a:1,2=b:2,3=c:3"])).unwrap();
        assert_eq!(c.advertise, "b:2");
        assert!(!c.is_bootstrapper());
        let same = Config::from_flags(flags(&["--id", "2", "--advertise", "b:2", "--peers", "1=a:1,2=b:2"])).unwrap();
        assert_eq!(same.advertise, "b:2");
        let other = Config::from_flags(flags(&["--id", "2", "--advertise", "x:2", "--peers", "1=a:1,2=b:2"]));
        assert!(matches!(other, Err(ConfigError::AdvertiseNotPeer { .. })), "{other:?}");
        assert!(!c.advertise_guessed && !same.advertise_guessed);
    }

    /// Only an address no flag named is a guess, which `--force-new-cluster` does not record.
    #[test]
    fn an_address_no_flag_named_is_a_guess() {
        let guessed = Config::from_flags(flags(&["--id", "1", "--listen", "0.0.0.0:9000"])).unwrap();
        assert_eq!((guessed.advertise.as_str(), guessed.advertise_guessed), ("127.0.0.1:9000", true));
        let named = Config::from_flags(flags(&["--id", "4", "--advertise", "h:4", "--join"])).unwrap();
        assert!(!named.advertise_guessed);
    }

    #[test]
    fn snapshot_logs_out_of_range_are_refused() {
        for bad in ["0", &(SNAPSHOT_LOGS_MAX + 1).to_string(), &u64::MAX.to_string()] {
            let refused = Config::from_flags(flags(&["--snapshot-logs", bad]));
            assert!(matches!(refused, Err(ConfigError::SnapshotLogs)), "{bad}: {refused:?}");
        }
        assert!(Config::from_flags(flags(&["--snapshot-logs", &SNAPSHOT_LOGS_MAX.to_string()])).is_ok());
    }

    #[test]
    fn timings_out_of_range_are_refused_without_overflow() {
        for bad in [
            &["--heartbeat-ms", "0"][..],
            &["--heartbeat-ms", "500", "--election-timeout-ms", "1000"],
            &["--heartbeat-ms", "6148914691236517206", "--election-timeout-ms", "6148914691236517206"],
            &["--election-timeout-ms", "18446744073709551615"],
        ] {
            assert!(matches!(Config::from_flags(flags(bad)), Err(ConfigError::Timings)), "{bad:?}");
        }
        assert!(Config::from_flags(flags(&["--election-timeout-ms", "600000"])).is_ok());
    }

    #[test]
    fn bad_peers_are_one_line_errors() {
        for bad in [
            "1=a",
            "x=a:1",
            "1=a:1,1=b:2",
            "0=a:1",
            "1=a:notaport",
            "1=h:8081,2=h:8081",
            "1=http://a:1",
            "1=a b:80",
            "1=::1:80",
            "1=[nope]:80",
            "1=a/b:80",
        ] {
            let err = Config::from_flags(flags(&["--peers", bad])).unwrap_err();
            assert!(matches!(err, ConfigError::Peers(_)), "{bad}: {err}");
        }
        for fine in ["1=[::1]:8080", "1=10.0.0.7:8080", "1=node-1.pubsub_net:8080"] {
            assert!(Config::from_flags(flags(&["--peers", fine])).is_ok(), "{fine}");
        }
        let err = Config::from_flags(flags(&["--id", "4", "--peers", "1=a:1,2=b:2"])).unwrap_err();
        assert!(matches!(err, ConfigError::IdNotInPeers { .. }));
    }

    #[test]
    fn loopback_addresses_are_told_apart() {
        for address in ["127.0.0.1:8080", "127.0.1.1:1", "localhost:8080", "LOCALHOST:1", "[::1]:8080"] {
            assert!(is_loopback(address), "{address}");
        }
        for address in ["10.0.0.2:8080", "node1:8080", "[2001:db8::1]:8080", "0.0.0.0:8080", "example.com:80"] {
            assert!(!is_loopback(address), "{address}");
        }
    }

    /// Peers at loopback addresses and elsewhere could not all reach each other; all of one
    /// kind is fine.
    #[test]
    fn peers_mixing_loopback_and_other_addresses_are_refused() {
        let peers_of = |text: &str| Config::from_flags(flags(&["--peers", text])).unwrap().peers;
        for mixed in ["1=127.0.0.1:8081,2=node2:8080", "1=node1:8080,2=localhost:8082,3=node3:8080"] {
            let err = refuse_mixed_loopback(&peers_of(mixed)).unwrap_err();
            assert!(matches!(&err, ConfigError::Peers(e) if e.contains("loopback")), "{mixed}: {err}");
        }
        for fine in ["1=127.0.0.1:8081,2=localhost:8082,3=[::1]:8083", "1=node1:8080,2=10.0.0.2:8080"] {
            assert!(refuse_mixed_loopback(&peers_of(fine)).is_ok(), "{fine}");
        }
    }
}
