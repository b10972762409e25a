"""Does a deregistered region still accept a peer's WRITE over UCX's transports on this machine?

The target registers a buffer and hands its NIXL metadata to the writer; the writer writes pattern 1
(it must land); the target deregisters the region; the writer writes pattern 2 with the descriptors it
already holds. Does it land, fail, or say done without landing? (Issue 38, item 5: whether removing a
key can end its access to memory at the data plane; docs/trust-model.md states the answer.)

    python tests/transports/deregistration_probe.py
"""
import multiprocessing as mp
import os
import time

import numpy as np

N = 1 << 20


def target(conn, env):
    os.environ.update(env)
    from kvpolicy.transports.agent import NixlSettings, create_agent
    settings = NixlSettings()
    settings.apply_environment()
    agent = create_agent("target", settings)
    buf = np.zeros(N, dtype=np.uint8)
    reg = agent.register_memory([(buf.ctypes.data, N, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), buf.ctypes.data))
    conn.recv()  # first write done
    first = int(buf[:16].sum())
    agent.deregister_memory(reg)
    conn.send(first)
    conn.recv()  # second write attempted
    time.sleep(0.5)
    conn.send(int(buf[:16].sum()))
    conn.recv()


def writer(conn, env):
    os.environ.update(env)
    from kvpolicy.transports.agent import NixlSettings, create_agent
    settings = NixlSettings()
    settings.apply_environment()
    agent = create_agent("writer", settings)
    src = np.full(N, 1, dtype=np.uint8)
    agent.register_memory([(src.ctypes.data, N, 0, "")], "DRAM")
    metadata, addr = conn.recv()
    name = agent.add_remote_agent(metadata)

    def write():
        local = agent.get_xfer_descs(np.array([[src.ctypes.data, N, 0]], dtype=np.uint64), "DRAM")
        far = agent.get_xfer_descs(np.array([[addr, N, 0]], dtype=np.uint64), "DRAM")
        try:
            xfer = agent.initialize_xfer("WRITE", local, far, name)
            state = agent.transfer(xfer)
            deadline = time.monotonic() + 5
            while state not in ("DONE", "ERR") and time.monotonic() < deadline:
                state = agent.check_xfer_state(xfer)
                time.sleep(0.001)
            return state
        except Exception as exc:  # noqa: BLE001  (any failure is the probe's answer, sent to the test)
            return f"raised {type(exc).__name__}: {exc}"[:200]

    first = write()
    conn.send(first)
    landed_first = conn.recv()
    src[:] = 2
    second = write()
    conn.send(second)
    conn.recv()
    conn.send((first, landed_first, second))


def run(label, env, quiet=False):
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    c, d = ctx.Pipe()
    t = ctx.Process(target=target, args=(a, env))
    w = ctx.Process(target=writer, args=(c, env))
    t.start()
    w.start()
    md = b.recv()
    d.send(md)
    first_state = d.recv()
    b.send("go")
    landed_first = b.recv()
    d.send(landed_first)
    second_state = d.recv()
    b.send("go")
    after = b.recv()
    d.send("done")
    summary = d.recv()
    b.send("bye")
    t.join(10)
    w.join(10)
    if quiet:
        return summary, after
    print(f"{label}: first write {first_state}, landed sum {landed_first} (16 = yes); after deregister: write {second_state}, "
          f"target bytes sum {after} (32 = the second write landed in deregistered memory)")


if __name__ == "__main__":
    base = {"UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib"}
    run("default transports (CMA/shared memory)", base)
    run("UCX_TLS=tcp", {**base, "UCX_TLS": "tcp"})
