//! The bench as a library (what the lab report calls): a server on a thread,
//! clients run in-process, counts that add up. Loopback only.

use nanowire_bench::{ClientConfig, Mode, Protocol, Rate, ServerConfig, run_client, start_server};
use nanowire_stack::EngineKind;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

fn lo() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)
}

fn client(mode: Mode, srv: SocketAddrV4, proto: Protocol, engine: EngineKind) -> ClientConfig {
    let mut c = ClientConfig::new(mode, srv);
    c.protocol = proto;
    c.engine = engine;
    c.msg_size = 64;
    c.duration = Duration::from_millis(400);
    c.warmup = Duration::from_millis(100);
    c
}

#[test]
fn udp_and_tcp_counts_add_up() {
    for proto in [Protocol::Udp, Protocol::Tcp] {
        for engine in [EngineKind::Kernel, EngineKind::Spin] {
            let mut sc = ServerConfig::new(lo());
            sc.protocol = proto;
            sc.engine = engine;
            let srv = start_server(&sc).unwrap();
            let addr = srv.local_addr();
            assert_ne!(addr.port(), 0);

            let pp = run_client(&client(Mode::PingPong, addr, proto, engine)).unwrap();
            assert_eq!(pp.engine, engine.as_str());
            assert!(pp.received > 0 && pp.received == pp.sent, "{pp:?}");
            assert_eq!(pp.dropped, 0);
            let lat = pp.latency_us.unwrap();
            assert!(lat.min <= lat.p50 && lat.p50 <= lat.p99 && lat.p99 <= lat.max);
            assert_eq!(lat.samples, pp.received);

            let mut ul = client(Mode::UnderLoad, addr, proto, engine);
            ul.mps = Rate::PerSec(5000);
            ul.reply_every = 5;
            let ulr = run_client(&ul).unwrap();
            assert!(ulr.received > 0);
            assert_eq!(ulr.dropped, 0);

            let mut tp = client(Mode::Throughput, addr, proto, engine);
            tp.mps = Rate::PerSec(20000);
            let tpr = run_client(&tp).unwrap();
            assert!(tpr.sent > 0 && tpr.latency_us.is_none());

            std::thread::sleep(Duration::from_millis(150));
            let live = srv.snapshot();
            assert_eq!(live.clients.len(), 3, "{live:?}");
            let st = srv.stop().unwrap();
            assert_eq!(st.clients.len(), 3);
            let peers: Vec<&str> = st.clients.iter().map(|c| c.peer.as_str()).collect();
            assert!(
                peers[0].ends_with(&pp.local_addr),
                "{peers:?} {}",
                pp.local_addr
            );
            // Every timed message plus the probe reached the server or is
            // counted as dropped by its socket (UDP under a stalled server).
            let sent: u64 = [&pp, &ulr, &tpr].iter().map(|r| r.total_sent + 1).sum();
            let got: u64 = st.clients.iter().map(|c| c.received).sum();
            assert_eq!(got + st.socket_drops, sent, "{st:?}");
            if proto == Protocol::Tcp {
                assert_eq!(st.socket_drops, 0);
            }
            for c in &st.clients {
                assert_eq!(c.duplicated, 0);
                assert_eq!(c.out_of_order, 0);
            }
            assert_eq!(st.clients[0].received, pp.total_sent + 1);
            assert_eq!(st.clients[0].dropped, 0);
            assert_eq!(st.clients[0].replied, pp.total_sent + 1);
            assert_eq!(st.clients[2].replied, 1, "tp: only the probe is answered");
            assert_eq!(st.warmup, 12);
            assert_eq!(st.malformed, 0);
        }
    }
}

#[test]
fn xdp_is_reported_not_panicked() {
    let mut sc = ServerConfig::new(lo());
    sc.engine = EngineKind::Xdp;
    sc.protocol = Protocol::Tcp;
    match start_server(&sc) {
        Ok(_) => panic!("TCP over xdp should be refused"),
        Err(e) => assert!(e.contains("xdp"), "{e}"),
    }
}
