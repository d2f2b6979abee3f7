"""Two hosts on one machine for the integration tests (/work/shared/INFRA.md "Network
namespaces"): two network namespaces joined by a veth pair, processes started in either,
a relay that brings an HTTP port of one namespace's loopback to the host's loopback, and
a packet capture on the veth (an AF_PACKET socket: there is no tcpdump) written as pcap.

The host namespace has no route to the namespaces' addresses (traffic to them would leave
the machine), so nothing here sends from the test process to those addresses: the relay
runs inside the namespace, accepting on a socket the test made in the host's namespace
and handed down (a socket stays in the namespace it was made in).

Run as a script inside a namespace: `netns.py relay FD PORT` and `netns.py capture IFACE
FILE` (it prints "ready" once bound; SIGTERM ends it)."""
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

SUBNET = "10.213.0."
ADDRESS_A, ADDRESS_B = SUBNET + "1", SUBNET + "2"
ETH_P_ALL = 0x0003
PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)  # LINKTYPE_ETHERNET


class TwoHosts:
    """Namespaces a and b; veth_a (ADDRESS_A, in a) and veth_b (ADDRESS_B, in b); lo up in
    both. Processes started through spawn() are stopped by close(), which then deletes the
    namespaces (and with them the veth pair)."""

    def __init__(self):
        tag = secrets.token_hex(3)  # interface names are at most 15 characters
        self.a, self.b = "smelt-a-%d-%s" % (os.getpid(), tag), "smelt-b-%d-%s" % (os.getpid(), tag)
        self.veth_a, self.veth_b = "smva" + tag, "smvb" + tag
        self.made, self.procs = [], []

    def setup(self):
        """None when made, else why not (a reason to skip)."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        if shutil.which("ip") is None:
            return "no `ip` (iproute2) to make network namespaces with"
        steps = [["netns", "add", self.a], ["netns", "add", self.b],
                 ["link", "add", self.veth_a, "type", "veth", "peer", "name", self.veth_b],
                 ["link", "set", self.veth_a, "netns", self.a], ["link", "set", self.veth_b, "netns", self.b]]
        for ns, veth, address in ((self.a, self.veth_a, ADDRESS_A), (self.b, self.veth_b, ADDRESS_B)):
            steps += [["-n", ns, "link", "set", "lo", "up"], ["-n", ns, "addr", "add", address + "/24", "dev", veth],
                      ["-n", ns, "link", "set", veth, "up"]]
        for step in steps:
            r = subprocess.run(["ip"] + step, capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                return "`ip %s` failed: %s" % (" ".join(step), r.stderr.strip())
            if step[:2] == ["netns", "add"]:
                self.made.append(step[2])
        return None

    def launcher(self, ns):
        """argv prefix that runs a program in namespace ns (ip execs it in place)."""
        return ["ip", "netns", "exec", ns]

    def spawn(self, ns, argv, **popen_args):
        proc = subprocess.Popen(self.launcher(ns) + argv, **popen_args)
        self.procs.append(proc)
        return proc

    def relay(self, ns, port):
        """A port on the host's 127.0.0.1 that forwards to ns's 127.0.0.1:port."""
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        try:
            self.spawn(ns, [sys.executable, os.path.abspath(__file__), "relay", str(listener.fileno()), str(port)],
                       pass_fds=[listener.fileno()])
            return listener.getsockname()[1]
        finally:
            listener.close()  # the relay holds its own copy

    def capture(self, ns, iface, path):
        """Starts a capture of iface (in ns) into path; returns once it is bound."""
        proc = self.spawn(ns, [sys.executable, os.path.abspath(__file__), "capture", iface, path],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.wait(timeout=10)
            raise AssertionError("the capture did not start: %s %s" % (line, proc.stderr.read()))
        return proc

    def close(self):
        for proc in reversed(self.procs):
            stop(proc)
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


# ---- reading a capture ----

def read_pcap(path):
    """The frames of a pcap file written by capture_main."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:len(PCAP_HEADER)] == PCAP_HEADER, "not a capture of ours: %s" % path
    frames, at = [], len(PCAP_HEADER)
    while at + 16 <= len(data):
        _, _, length, _ = struct.unpack_from("<IIII", data, at)
        frames.append(data[at + 16:at + 16 + length])
        at += 16 + length
    return frames


def tcp_payloads(frames, port):
    """[(from_port, payload)] of the IPv4 TCP segments to or from port that carry data."""
    out = []
    for frame in frames:
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:  # IPv4, TCP
            continue
        ip_len = (frame[14] & 0x0F) * 4
        total = struct.unpack_from("!H", frame, 16)[0]
        tcp = 14 + ip_len
        sport, dport = struct.unpack_from("!HH", frame, tcp)
        data = frame[tcp + (frame[tcp + 12] >> 4) * 4:14 + total]
        if port in (sport, dport) and data:
            out.append((sport, data))
    return out


# ---- run inside a namespace ----

def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:  # the other side went: so does this direction
        pass
    for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
        try:
            sock.shutdown(how)
        except OSError:
            pass


def relay_main(fd, port):
    listener = socket.socket(fileno=fd)
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            client.close()
            continue
        server.settimeout(None)
        threading.Thread(target=pump, args=(client, server), daemon=True).start()
        threading.Thread(target=pump, args=(server, client), daemon=True).start()


def capture_main(iface, path):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((iface, 0))
    with open(path, "wb") as out:
        out.write(PCAP_HEADER)
        out.flush()
        print("ready", flush=True)
        while True:
            frame = sock.recv(65535)
            now = time.time()
            out.write(struct.pack("<IIII", int(now), int(now % 1 * 1e6), len(frame), len(frame)) + frame)
            out.flush()  # SIGTERM may come at any time: what was seen is on disk


if __name__ == "__main__":
    if sys.argv[1:2] == ["relay"] and len(sys.argv) == 4:
        relay_main(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1:2] == ["capture"] and len(sys.argv) == 4:
        capture_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: netns.py relay FD PORT | capture IFACE FILE")
