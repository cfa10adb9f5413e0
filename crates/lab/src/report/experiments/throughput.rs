//! 5. Throughput and CPU efficiency.

use super::*;

impl<'a> Ctx<'a> {
    pub(crate) fn est_throughput(&self) -> f64 {
        let n_udp = self.engines.len() * self.p.tp.sizes_udp.len();
        let n_tcp = self.engines.len() * self.p.tp.sizes_tcp.len();
        ((n_udp + n_tcp) as f64 * (self.p.tp.secs + 0.9)
            + if self.p.tp.iperf_udp {
                self.p.tp.sizes_udp.len() as f64 * (self.p.tp.secs + 0.9)
            } else {
                0.0
            })
            * self.repeats as f64
    }

    pub(crate) fn throughput(&self, mut ex: Experiment) -> Experiment {
        ex.method = format!(
            "UDP: `nanowire bench burst --duration {s}` unpaced into `nanowire bench sink --behaviour spin`, both ends on the engine under test; Gbps counts payload received. TCP: iperf3 for the kernel engine (-A pins), `nanowire bench tp --tcp` for the others. %CPU is both hosts' processes (utime+stime from /proc of the two processes, 100% = one core); lower %CPU per Gbps is better. A spinning receiver burns its core by design.{}",
            if self.p.tp.iperf_udp {
                " iperf3 -u is shown as a reference line for the kernel engine."
            } else {
                ""
            },
            s = self.p.tp.secs
        );
        // (label, proto, size) -> (gbps samples, cpu% samples)
        let mut data: TpData = BTreeMap::new();
        let mut engines_lines: Vec<(String, String)> = vec![];
        for &e in &self.engines {
            let mut failed = None;
            for &size in &self.p.tp.sizes_udp {
                for rep in 0..self.repeats {
                    self.tp_step("udp", e, size, rep);
                    match self.trial(e, e, "spin", size, 0, Some(self.p.tp.secs), None, 0, 300) {
                        Ok((g, s, raw)) if s.received > 0 && s.active_s > 0.0 => {
                            if g.engine != e || s.engine != e {
                                failed = Some(format!("fell back to {}/{}", g.engine, s.engine));
                                break;
                            }
                            let gbps = s.bytes as f64 * 8.0 / s.active_s / 1e9;
                            let cpu = g.cpu_s / g.elapsed_s.max(1e-9) * 100.0
                                + s.cpu_s / s.wall_s.max(1e-9) * 100.0;
                            ex.runs.push(json!({"engine": e, "protocol": "udp", "size": size, "repeat": rep, "gbps": gbps, "cpu_pct": cpu, "result": raw}));
                            let d = data.entry((e.to_string(), "udp".into(), size)).or_default();
                            d.0.push(gbps);
                            d.1.push(cpu);
                        }
                        Ok(_) => {
                            ex.notes.push(format!("{e} udp {size} B: nothing received"));
                        }
                        Err(r) => {
                            ex.notes.push(format!("{e} udp {size} B: {r}"));
                            if !data.keys().any(|k| k.0 == e.as_str() && k.1 == "udp")
                                && size == self.p.tp.sizes_udp[0]
                            {
                                failed = Some(r);
                            }
                            break;
                        }
                    }
                }
                if failed.is_some() {
                    break;
                }
            }
            match failed {
                Some(r) => ex.unavailable(e.as_str(), "udp", r),
                None if data.keys().any(|k| k.0 == e.as_str() && k.1 == "udp") => {
                    ex.measured(e.as_str(), "udp");
                    engines_lines.push((e.to_string(), "udp".into()));
                }
                None => ex.unavailable(e.as_str(), "udp", "no size could be measured"),
            }
            // TCP
            let r = if e == EngineKind::Kernel {
                self.iperf_series(e, true, &mut data, &mut ex)
            } else {
                self.bench_tp_tcp(e, &mut data, &mut ex)
            };
            match r {
                Ok(()) => {
                    ex.measured(e.as_str(), "tcp");
                    engines_lines.push((e.to_string(), "tcp".into()));
                }
                Err(r) => ex.unavailable(e.as_str(), "tcp", r),
            }
        }
        if self.p.tp.iperf_udp
            && self.engines.contains(&EngineKind::Kernel)
            && self
                .iperf_series(EngineKind::Kernel, false, &mut data, &mut ex)
                .is_ok()
        {
            engines_lines.push(("kernel (iperf3)".into(), "udp".into()));
        }
        let mut rows = vec![];
        for proto in ["udp", "tcp"] {
            let mut s_gbps = vec![];
            let mut s_eff = vec![];
            for (label, p) in engines_lines.iter().filter(|(_, p)| p == proto) {
                let mut g = Series::new(label, label.split(' ').next().unwrap_or(""), p, "gbps");
                let mut c = Series {
                    metric: "cpu_pct_per_gbps".into(),
                    ..g.clone()
                };
                for ((l, pp, size), (gb, cpu)) in &data {
                    if l != label || pp != p {
                        continue;
                    }
                    if let Some(pt) = Point::from_samples(*size as f64, gb.clone()) {
                        g.points.push(pt);
                    }
                    let eff: Vec<f64> = gb
                        .iter()
                        .zip(cpu)
                        .filter(|(g, _)| **g > 0.0)
                        .map(|(g, c)| c / g)
                        .collect();
                    if let Some(pt) = Point::from_samples(*size as f64, eff.clone()) {
                        c.points.push(pt);
                    }
                    rows.push(vec![
                        json!(label),
                        json!(p),
                        json!(size),
                        jnum(median(gb)),
                        jnum(median(cpu)),
                        jnum(median(&eff)),
                        json!(gb.len()),
                    ]);
                }
                g.points.sort_by(|a, b| a.x.total_cmp(&b.x));
                c.points.sort_by(|a, b| a.x.total_cmp(&b.x));
                s_gbps.push(g);
                s_eff.push(c);
            }
            ex.plots.push(
                Plot::per_proto(proto, "throughput", "throughput vs I/O size")
                    .log_log(("I/O size (bytes)", "Gbps received"), s_gbps),
            );
            ex.plots.push(
                Plot::per_proto(proto, "cpu_per_gbps", "%CPU per Gbps (both hosts)")
                    .log_log(("I/O size (bytes)", "%CPU per Gbps"), s_eff),
            );
        }
        ex.tables.push(Table {
            caption: "Throughput and CPU, medians of the repeats".into(),
            columns: [
                "engine",
                "proto",
                "size (B)",
                "Gbps",
                "%CPU (both hosts)",
                "%CPU per Gbps",
                "runs",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        });
        ex.flag_spread(0.5);
        ex
    }

    pub(crate) fn iperf_series(
        &self,
        e: EngineKind,
        tcp: bool,
        data: &mut TpData,
        ex: &mut Experiment,
    ) -> Result<(), String> {
        if matches!(self.target, Target::Peer { .. }) {
            return Err("needs an iperf3 server on the peer; not started in --peer mode".into());
        }
        let label = if tcp {
            e.to_string()
        } else {
            format!("{e} (iperf3)")
        };
        let proto = proto_name(tcp);
        let sizes = if tcp {
            &self.p.tp.sizes_tcp
        } else {
            &self.p.tp.sizes_udp
        };
        let addr = self.target.server_addr().to_string();
        let mut any = None;
        for &size in sizes {
            for rep in 0..self.repeats {
                self.tp_step(proto, "iperf3", size, rep);
                let port = self.next_port().to_string();
                let srv = self.target.command(
                    Host::B,
                    &[
                        "iperf3".to_string(),
                        "-s".into(),
                        "-1".into(),
                        "-B".into(),
                        addr.clone(),
                        "-p".into(),
                        port.clone(),
                        "-A".into(),
                        SERVER_CPU.into(),
                    ],
                )?;
                let mut srv = Proc::spawn(srv, "iperf3 -s")?;
                srv.settle(Duration::from_millis(250))?;
                let secs = format!("{}", self.p.tp.secs.ceil().max(1.0) as u64);
                let mut a: Vec<String> = [
                    "iperf3",
                    "-c",
                    &addr,
                    "-p",
                    &port,
                    "-t",
                    &secs,
                    "-l",
                    &size.to_string(),
                    "-J",
                    "-A",
                    CLIENT_CPU,
                ]
                .map(String::from)
                .to_vec();
                if !tcp {
                    a.extend(["-u", "-b", "0"].map(String::from));
                }
                let cmd = self.target.command(Host::A, &a)?;
                let v = Proc::spawn(cmd, "iperf3 -c")?.finish_json(Duration::from_secs(30));
                drop(srv);
                let v = match v {
                    Ok(v) => v,
                    Err(r) => {
                        any.get_or_insert(Err(r));
                        break;
                    }
                };
                if let Some(err) = v.get("error").and_then(Value::as_str) {
                    any.get_or_insert(Err(format!("iperf3: {err}")));
                    break;
                }
                let end = &v["end"];
                let bps = if tcp {
                    end["sum_received"]["bits_per_second"].as_f64()
                } else {
                    end["sum"]["bits_per_second"].as_f64().map(|b| {
                        b * (1.0 - end["sum"]["lost_percent"].as_f64().unwrap_or(0.0) / 100.0)
                    })
                };
                let cpu = end["cpu_utilization_percent"]["host_total"]
                    .as_f64()
                    .unwrap_or(f64::NAN)
                    + end["cpu_utilization_percent"]["remote_total"]
                        .as_f64()
                        .unwrap_or(f64::NAN);
                if let Some(b) = bps.filter(|b| *b > 0.0 && cpu.is_finite()) {
                    let d = data.entry((label.clone(), proto.into(), size)).or_default();
                    d.0.push(b / 1e9);
                    d.1.push(cpu);
                    any = Some(Ok(()));
                    ex.runs.push(json!({"engine": label, "protocol": proto, "size": size, "repeat": rep, "tool": "iperf3", "gbps": b / 1e9, "cpu_pct": cpu, "result": {"end": {"sum_received": end["sum_received"], "sum": end["sum"], "cpu_utilization_percent": end["cpu_utilization_percent"]}}}));
                }
            }
        }
        any.unwrap_or_else(|| Err("iperf3 gave no result".into()))
    }

    /// Announce one throughput run (`who`: the engine or tool) on the
    /// progress bar.
    fn tp_step(&self, proto: &str, who: impl std::fmt::Display, size: usize, rep: u32) {
        self.progress.step(
            &format!(
                "throughput {proto} {who} {size} B ({}/{})",
                rep + 1,
                self.repeats
            ),
            self.p.tp.secs + 0.9,
        );
    }

    pub(crate) fn bench_tp_tcp(
        &self,
        e: EngineKind,
        data: &mut TpData,
        ex: &mut Experiment,
    ) -> Result<(), String> {
        let (mut srv, port) = self.start_server(e, true)?;
        let secs = self.p.tp.secs.ceil().max(1.0) as u64;
        let mut ok = false;
        for &size in &self.p.tp.sizes_tcp {
            for rep in 0..self.repeats {
                self.tp_step("tcp", e, size, rep);
                let cpu_srv0 = srv.as_mut().map_or(0.0, srv_cpu);
                let extra = vec![
                    "tp".to_string(),
                    "-m".into(),
                    size.to_string(),
                    "--mps".into(),
                    "max".into(),
                ];
                let t0 = std::time::Instant::now();
                let v = self.client(e, true, port, &extra, secs)?;
                let wall = t0.elapsed().as_secs_f64();
                let rate = num(&v, "rate_msg_s").ok_or("bench tp printed no rate_msg_s")?;
                let gbps = rate * size as f64 * 8.0 / 1e9;
                // The client measures its own thread's CPU (1.0 = one core); the server's
                // comes from /proc over the whole run.
                let cli_cpu = v
                    .get("cpu_util")
                    .and_then(Value::as_f64)
                    .map_or(100.0, |c| c * 100.0);
                let cpu = (srv.as_mut().map_or(0.0, srv_cpu) - cpu_srv0) / wall * 100.0 + cli_cpu;
                if gbps > 0.0 {
                    ok = true;
                    let d = data.entry((e.to_string(), "tcp".into(), size)).or_default();
                    d.0.push(gbps);
                    d.1.push(cpu);
                    ex.runs.push(json!({"engine": e, "protocol": "tcp", "size": size, "repeat": rep, "gbps": gbps, "cpu_pct": cpu, "result": v}));
                }
            }
        }
        drop(srv);
        if ok {
            Ok(())
        } else {
            Err("bench tp --tcp measured nothing".into())
        }
    }
}
