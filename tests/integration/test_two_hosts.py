"""Two hosts (issue 28, docs/security.md "Agents"): smeltd in one network namespace with
its agents port on the veth's address and no embedded agent, an enrolled smelt-agent in a
second namespace that reaches it only over the veth pair, and a packet capture on that
veth while a job runs on the agent to `succeeded`. Under CURVE the capture holds the
agents' traffic but neither the job id, nor its training file's id or name, nor a
message type; the same run with `--insecure-agents` shows the job id and the message
types in the capture, so the capture does see what is sent (the file's id and name are
never sent: the launch names the job's spec file). The test process reaches smeltd's HTTP API only through
a relay running inside smeltd's namespace (tests/integration/netns.py). Skipped where
network namespaces cannot be made (not root, no `ip`)."""
import os

import pytest

from conftest import SMALL_JOB, TRAIN_FILE
from netns import ADDRESS_A, TwoHosts, read_pcap, stop, tcp_payloads
from test_agent_security import agents, create_job, enroll, events, wait_agent  # noqa: F401 (a fixture)

AGENTS_PORT = 7071  # in a fresh namespace: nothing else is bound there


@pytest.fixture
def two_hosts():
    hosts = TwoHosts()
    try:
        why = hosts.setup()
        if why:
            pytest.skip(why)
        yield hosts
    finally:
        hosts.close()  # after smeltd and the agent: fixtures end in the reverse order


def secrets_of(smeltd, job):
    """What an eavesdropper must not learn: (what the agents' protocol carries — the job id
    and the message types —, what it never carries — the training file's id and name: the
    launch names the job's spec file, which the agent reads from the shared filesystem)."""
    status, f = smeltd.request("GET", "/v1/files/" + job["training_file"])
    assert status == 200, f
    return [job["id"], "worker.launch", "worker.event", "agent.heartbeat"], [f["id"], f["filename"]]


def start_two_hosts(two_hosts, start_smeltd, extra):
    endpoint = "tcp://%s:%d" % (ADDRESS_A, AGENTS_PORT)
    smeltd = start_smeltd(extra_args=["--agents", endpoint, "--no-local-agent"] + extra,
                          launcher=two_hosts.launcher(two_hosts.a))
    smeltd.http_port = two_hosts.relay(two_hosts.a, smeltd.port)
    status, cluster = smeltd.request("GET", "/v1/cluster")  # through the relay, inside namespace a
    assert status == 200 and cluster["agents"] == [], cluster
    return smeltd, endpoint


@pytest.mark.parametrize("secure", [True, False], ids=["curve", "insecure"])
def test_agent_on_another_host_runs_a_job_unseen(two_hosts, start_smeltd, agents, tmp_path, secure):  # noqa: F811
    smeltd, endpoint = start_two_hosts(two_hosts, start_smeltd, [] if secure else ["--insecure-agents"])
    pcap = str(tmp_path / "veth.pcap")
    capture = two_hosts.capture(two_hosts.b, two_hosts.veth_b, pcap)  # before the agent's first packet
    if secure:
        cred, key_file = enroll(smeltd, "node-b", str(tmp_path))
        assert cred["key_file"]["endpoint"] == endpoint
        args = ["--credential", key_file]
    else:
        args = ["--server", endpoint, "--id", "node-b"]
    agents(smeltd, "b", args, launcher=two_hosts.launcher(two_hosts.b))
    wait_agent(smeltd, "node-b", "online")
    job = create_job(smeltd, SMALL_JOB)
    done = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"))
    assert done["status"] == "succeeded", (done, smeltd.read_log_all()[-3000:])
    assert any("Job started on node-b" in e["message"] for e in events(smeltd, job["id"]))
    sent, unsent = secrets_of(smeltd, job)
    assert os.path.basename(TRAIN_FILE) in unsent
    stop(capture)

    segments = tcp_payloads(read_pcap(pcap), AGENTS_PORT)
    to_server = b"".join(data for port, data in segments if port != AGENTS_PORT)
    to_agent = b"".join(data for port, data in segments if port == AGENTS_PORT)
    # the agents' traffic crossed the veth both ways, from the ZMTP greeting (its
    # mechanism name is plain text in either mode) to the job's end: more than the
    # greetings and handshakes (a plain-text run of a short job sends the agent under
    # 1 KB: its registration, acks and the launch; what was sent is checked below)
    assert len(to_server) > 256 and len(to_agent) > 256, (len(to_server), len(to_agent))
    mechanism = b"CURVE" if secure else b"NULL"
    assert to_server[:64].find(mechanism) > 0 and to_agent[:64].find(mechanism) > 0, (to_server[:64], to_agent[:64])
    with open(pcap, "rb") as f:
        raw = f.read()
    for text in sent + unsent:
        seen = [where for where, blob in (("a frame", raw), ("to smeltd", to_server), ("to the agent", to_agent))
                if text.encode() in blob]
        if secure:
            assert not seen, "%r in plain text on the wire (%s)" % (text, seen)
        elif text in sent:
            assert seen, "the capture missed %r: it does not see what is sent" % text
