"""scripts/bench/net --shaped: downloads over a shaped link (10 ms RTT, tbf at each rate) from a
server in its own network namespace, directly and through each proxy, with each proxy's CPU."""

import json
import os
import select
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# the link's two ends: 10.233.77.1 here (the host's netns, where the proxies connect from),
# 10.233.77.2 in the server's netns
NEAR, FAR = "10.233.77.1", "10.233.77.2"
PATHS = ("direct", "cowbox", "tinyproxy", "squid")


def sh(*cmd, ns=None):
    if ns:
        cmd = ("ip", "netns", "exec", ns) + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def tree_cpu(pid):
    """CPU seconds (user + system, and of waited-for children) of pid and its descendants."""
    stats, kids = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                f = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(d)] = sum(int(x) for x in f[11:15])  # utime stime cutime cstime
        kids.setdefault(int(f[1]), []).append(int(d))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, 0)
        todo += kids.get(p, [])
    return total / os.sysconf("SC_CLK_TCK")


def listener_pid(ns_path, port):
    """The process holding the listening socket on port in the netns at ns_path."""
    out = subprocess.run(["nsenter", "--net=" + ns_path, "ss", "-ltnpH", "sport = :%d" % port],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split("pid=")[1].split(",")[0])


def rate_bytes(rate):
    return int(rate.rstrip("gbit")) * 10 ** 9 // 8


def shape(devs, rate):
    """tbf at rate on each end's egress; a burst of 2 ms of the rate (at least 256 KiB: a GSO
    packet must fit) and a queue of 20 ms."""
    burst = max(rate_bytes(rate) // 500, 256 << 10)
    for dev, ns in devs:
        sh("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst",
           str(burst), "latency", "20ms", ns=ns)


def run(args, net):
    """net: scripts/bench/net's own module (its build, install and control helpers)."""
    bdir = net.build()
    cowbox = os.path.join(bdir, "cowbox")
    tp = net.installed("tinyproxy", "tinyproxy")
    sq = net.installed("squid", "squid-openssl")
    import tempfile
    tmp = tempfile.mkdtemp(prefix="cowbox-bench-shaped-")
    os.chmod(tmp, 0o711)
    prog = os.path.join(tmp, "net-shaped")
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", os.path.join(HERE, "net-shaped.c"), "-o",
                    prog, "-pthread"], check=True)
    tag = "%d" % (os.getpid() % 100000)
    ns, dev_near, dev_far = "cbshaped" + tag, "cbsn" + tag, "cbsf" + tag
    env = dict(os.environ, COWBOX_HOME=os.path.join(tmp, "home"), COWBOX_BIN=cowbox)
    procs, ref, rows = [], None, {}
    load0 = os.getloadavg()
    try:
        sh("ip", "netns", "add", ns)
        line = subprocess.Popen([prog, "delay", "/run/netns/" + ns, dev_near, dev_far,
                                 str(int(args.rtt_ms * 1000 / 2))], stdout=subprocess.PIPE,
                                text=True)
        procs.append(line)
        if line.stdout.readline().strip() != "ready":
            raise SystemExit("bench/net: the delay line did not start")
        sh("ip", "addr", "add", NEAR, "peer", FAR, "dev", dev_near)
        sh("ip", "link", "set", dev_near, "up", "txqueuelen", "10000")
        sh("ip", "link", "set", "lo", "up", ns=ns)
        sh("ip", "addr", "add", FAR, "peer", NEAR, "dev", dev_far, ns=ns)
        sh("ip", "link", "set", dev_far, "up", "txqueuelen", "10000", ns=ns)
        # the server's send buffer may grow to a 10 Gbit/s x 10 ms window (its own netns's
        # setting; the host's are left as they are, and printed)
        sh("sysctl", "-qw", "net.ipv4.tcp_wmem=4096 16384 33554432", ns=ns)
        sport = net.free_port()
        srv = subprocess.Popen(["ip", "netns", "exec", ns, prog, "serve", str(sport)],
                               stdout=subprocess.PIPE, text=True)
        procs.append(srv)
        if srv.stdout.readline().strip() != "ready":
            raise SystemExit("bench/net: the server did not start")
        tport, qport = net.free_port(), net.free_port()
        with open(os.path.join(tmp, "tinyproxy.conf"), "w") as f:
            f.write("Port %d\nListen 127.0.0.1\nTimeout 600\nMaxClients 64\nLogLevel Critical\n"
                    "LogFile \"%s/tinyproxy.log\"\nConnectPort %d\nDisableViaHeader Yes\n"
                    % (tport, tmp, sport))
        procs.append(subprocess.Popen([tp, "-d", "-c", os.path.join(tmp, "tinyproxy.conf")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        tpp = procs[-1]
        procs.append(subprocess.Popen([sq, "-N", "-f", net.squid_conf(tmp, qport)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        sqp = procs[-1]
        net.wait_port(tport)
        net.wait_port(qport)
        ref = net.run_out([cowbox, "create", "--network", "allow", "--allow",
                           "%s:%d" % (FAR, sport)], env).strip()
        mnt = json.loads(net.run_out([cowbox, "mount", ref, "--json"], env))["mountpoint"]
        nsinfo = net.control(mnt, {"op": "netns"})
        ws_ns = "/proc/%d/fd/%d" % (nsinfo["pid"], nsinfo["fd"])
        daemon = listener_pid(ws_ns, 3128)
        cmd = {"direct": [FAR, str(sport), str(args.bytes)],
               "cowbox": [FAR, str(sport), str(args.bytes), "3128", ws_ns],
               "tinyproxy": [FAR, str(sport), str(args.bytes), str(tport)],
               "squid": [FAR, str(sport), str(args.bytes), str(qport)]}
        pids = {"cowbox": daemon, "tinyproxy": tpp.pid, "squid": sqp.pid}
        print("shaped link: a delay line of %.1f ms each way (tun devices with TSO; no netem in "
              "this kernel), tbf at each rate on both ends; host tcp_rmem %s; %d bytes a "
              "download; load average %.2f" % (args.rtt_ms / 2, open(
                  "/proc/sys/net/ipv4/tcp_rmem").read().split()[2], args.bytes, load0[0]))
        for rate in args.rates.split(","):
            shape([(dev_near, None), (dev_far, ns)], rate)
            for rnd in range(args.rounds):
                base = None
                for path in PATHS:
                    c0 = tree_cpu(pids[path]) if path in pids else 0
                    d0, s0 = tree_cpu(line.pid), tree_cpu(srv.pid)
                    p = subprocess.run([prog, "get"] + cmd[path], capture_output=True,
                                       text=True)
                    c1 = tree_cpu(pids[path]) if path in pids else 0
                    d1, s1 = tree_cpu(line.pid), tree_cpu(srv.pid)
                    if p.returncode:
                        print("bench/net: %s at %s failed: %s" % (path, rate, p.stderr.strip()),
                              file=sys.stderr)
                        continue
                    r = json.loads(p.stdout)
                    mbs = r["bytes"] / r["secs"] / 1e6
                    gib = r["bytes"] / 2 ** 30
                    # the server's view of the same connection (printed once the client
                    # closed): what held its sending back
                    ready = select.select([srv.stdout], [], [], 30)[0]
                    snd = json.loads(srv.stdout.readline()) if ready else None
                    if path == "direct":
                        base = mbs
                    row = {"round": rnd, "mbs": mbs, "x": mbs / base if base else float("nan"),
                           "cpu": (c1 - c0) / gib if path in pids else None,
                           # the whole path's: server, delay line, proxy and client
                           "path_cpu": (d1 - d0 + s1 - s0 + c1 - c0 + r["cpu"]) / gib,
                           "rwnd": 100 * snd["rwnd_limited_ms"] / snd["busy_ms"]
                           if snd and snd["busy_ms"] else float("nan")}
                    rows.setdefault((rate, path), []).append(row)
                    print("%-6s round %d %-9s %7.1f MB/s  %5.3fx direct  %-22s  path CPU "
                          "%.2f s/GiB (delay line %.2f, server %.2f, client %.2f)  sender: %s  (load %.2f)"
                          % (rate, rnd + 1, path, mbs, row["x"],
                             "proxy CPU %.2f s/GiB" % row["cpu"] if path in pids else
                             "no proxy", row["path_cpu"], (d1 - d0) / gib, (s1 - s0) / gib,
                             r["cpu"] / gib, "busy %.0f ms, rwnd-limited %.0f%%, sndbuf-limited "
                             "%.0f%%, %d retransmits, srtt %.1f ms (min %.1f), cwnd %.0f KB"
                             % (snd["busy_ms"], row["rwnd"], 100 * snd["sndbuf_limited_ms"] /
                                max(snd["busy_ms"], 1e-9), snd["retrans"], snd["srtt_ms"],
                                snd["min_rtt_ms"], snd["cwnd_kb"]) if snd else "-",
                             os.getloadavg()[0]))
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        if ref:
            subprocess.run([cowbox, "rm", "-f", ref], env=env, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    print_summary(rows, args)
    print("load average %.2f before, %.2f after" % (load0[0], os.getloadavg()[0]))


def print_summary(rows, args):
    """Per rate and path: the median download over the rounds [range], its ratio to the direct
    one of the same round, the proxy's CPU seconds per GiB and the whole path's (server, delay
    line, proxy, client: what a CPU-bound link is limited by), and the share of the server's busy
    sending time that the receiver's window held it back (a reader that does not keep up, or a
    buffer too small for the link); then the goals, round by round."""
    fmt = lambda xs, f: (f % statistics.median(xs) + (" [%s..%s]" % (f % min(xs), f % max(xs))
                                                      if len(xs) > 1 else ""))
    hdr = ("rate", "path", "download MB/s", "x direct", "proxy CPU s/GiB", "path CPU s/GiB",
           "sender rwnd-limited %")
    lines = []
    for rate in args.rates.split(","):
        for path in PATHS:
            rs = rows.get((rate, path))
            if not rs:
                continue
            lines.append((rate, path, fmt([r["mbs"] for r in rs], "%.1f"),
                          fmt([r["x"] for r in rs], "%.3f"),
                          fmt([r["cpu"] for r in rs], "%.2f") if rs[0]["cpu"] is not None
                          else "-", fmt([r["path_cpu"] for r in rs], "%.2f"),
                          fmt([r["rwnd"] for r in rs], "%.0f")))
    print_table(hdr, lines, args.markdown)
    # the goals, round by round: cowbox's download against direct, its CPU against the others'
    for rate in args.rates.split(","):
        mine = rows.get((rate, "cowbox"), [])
        parts = ["x direct >= 0.95 in %d of %d rounds" % (sum(r["x"] >= 0.95 for r in mine),
                                                        len(mine))]
        for o in ("tinyproxy", "squid"):
            theirs = {r["round"]: r for r in rows.get((rate, o), [])}
            pairs = [(a, theirs[a["round"]]) for a in mine if a["round"] in theirs]
            parts.append("CPU below %s's in %d of %d" % (o, sum(a["cpu"] < b["cpu"]
                                                               for a, b in pairs), len(pairs)))
        print("%s: cowbox %s" % (rate, ", ".join(parts)))


def print_table(hdr, lines, markdown):
    if markdown:
        print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
        for l in lines:
            print("| " + " | ".join(l) + " |")
    else:
        w = [max(len(x[i]) for x in [hdr] + lines) for i in range(len(hdr))]
        for l in [hdr] + lines:
            print("  ".join(x.ljust(w[i]) for i, x in enumerate(l)))
