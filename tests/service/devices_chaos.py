"""Random events against gpuqd under the stand-in descriptor store, while the
GPUs it serves change, every buffer checked against a model (tests/service.sh).

gpuqd runs on the host backend with three devices (uuids HOST-0..2) under
``svc-helper supervise-store``; its configuration file names which of them
it serves, in which order. The events: buffers made, rewritten and freed on
a served GPU; the devices changed, with a SIGKILL, a SIGTERM or ``gpuq admin
restart`` to take the change up (or none changed); a SIGKILL while a put
runs; ``drop-absent`` of a GPU not served. The model keeps each buffer under
its GPU's uuid: after every event gpuqd must list exactly the model's
buffers of each served GPU at that GPU's index now, report the others' as
kept (``devices``' ``absent``), and, after each restart and now and then
besides, hold their bytes. A put cut short by the SIGKILL leaves its buffer
ready with the old bytes (it wrote nothing) or the new (it ended before the
kill), or ``suspect`` until a whole put.

usage: devices_chaos.py BUILD EVENTS SEED   (exit 1 with the seed, the event
log and the directory kept on the first difference)
"""
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BUILD, EVENTS, SEED = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
UUIDS = ["HOST-0", "HOST-1", "HOST-2"]
NAMES = ["a", "b", "c", "d", "e", "f"]
# Sizes carved from a shared slab and sizes with slabs of their own.
SIZES = [3000, 100000, 1 << 20, 3 << 20, 20 << 20]

rnd = random.Random(SEED)
tmp = tempfile.mkdtemp(prefix="gpuq-chaos.")
sock, store, conf = f"{tmp}/gpuqd.sock", f"{tmp}/store", f"{tmp}/gpuqd.conf"
events = open(f"{tmp}/events", "w")
# uuid -> buffer name -> the sha256 of its bytes; ("torn", old, new) after a put
# cut short, until gpuqd says which it came to (old None: it was suspect);
# SUSPECT once it said suspect.
model = {u: {} for u in UUIDS}
SUSPECT = "suspect"
torn = {"old": 0, "new": 0, "suspect": 0}  # what puts cut short came to
served = ["HOST-0", "HOST-1"]


class Differs(Exception):
    pass


def note(text):
    events.write(text + "\n")
    events.flush()


def gpuq(*args):
    r = subprocess.run([f"{BUILD}/gpuq", "--socket", sock, "--timeout", "30000", *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise Differs(f"gpuq {' '.join(args)} exited {r.returncode}: {r.stdout}{r.stderr}")
    return r.stdout


def write_config():
    with open(conf, "w") as f:
        f.write("devices = " + ",".join(u.split("-")[1] for u in served) + "\n")


def starts():
    try:
        with open(store) as f:
            return sum("start: " in line for line in f)
    except FileNotFoundError:
        return 0


def serving_pid():
    """gpuqd's pid once it answers (up to 20 s)."""
    for _ in range(400):
        r = subprocess.run([f"{BUILD}/gpuq", "--socket", sock, "--json", "ping"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return json.loads(r.stdout)["pid"]
        time.sleep(0.05)
    raise Differs("gpuqd did not answer for 20 s")


def restarted_after(before):
    for _ in range(600):
        if starts() > before:
            return serving_pid()
        time.sleep(0.05)
    raise Differs("the stand-in service manager did not start gpuqd again")


def ref(name, uuid):
    return f"{name}@{served.index(uuid)}"


def new_bytes(n):
    data = os.urandom(n)
    path = f"{tmp}/src"
    with open(path, "wb") as f:
        f.write(data)
    return path, hashlib.sha256(data).hexdigest()


def check(read_bytes):
    devices = json.loads(gpuq("--json", "devices"))
    got = [d["uuid"] for d in devices["devices"]]
    if got != served:
        raise Differs(f"gpuqd serves {got}, the configuration {served}")
    kept = {a["uuid"]: a["buffers"] for a in devices.get("absent", [])}
    want = {u: len(model[u]) for u in UUIDS if u not in served and model[u]}
    if kept != want:
        raise Differs(f"kept for GPUs not served: {kept}; the model: {want}")
    states = {(b["name"], b["device"]): b["state"]
              for b in json.loads(gpuq("--json", "buffers"))["buffers"]}
    want_listed = sorted((n, served.index(u)) for u in served for n in model[u])
    if sorted(states) != want_listed:
        raise Differs(f"buffers {sorted(states)}; the model: {want_listed}")
    for u in served:
        for n, held in list(model[u].items()):
            state = states[(n, served.index(u))]
            if held == SUSPECT or (isinstance(held, tuple) and state == SUSPECT):
                if state != SUSPECT:
                    raise Differs(f"{ref(n, u)} ({u}) is {state}; it was suspect")
                if model[u][n] != SUSPECT:
                    torn["suspect"] += 1
                model[u][n] = SUSPECT
                continue
            if state != "ready":
                raise Differs(f"{ref(n, u)} ({u}) is {state}, not ready")
            if not read_bytes and not isinstance(held, tuple):
                continue
            gpuq("get", ref(n, u), f"{tmp}/back")
            with open(f"{tmp}/back", "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            if sha not in (held[1:] if isinstance(held, tuple) else (held,)):
                raise Differs(f"{ref(n, u)} ({u}) holds other bytes than were put")
            if isinstance(held, tuple):
                torn["new" if sha == held[2] else "old"] += 1
            model[u][n] = sha


def restart(kind):
    """Devices changed (always for 'devices', else half the time), then taken up."""
    global served
    if kind == "devices" or rnd.random() < 0.5:
        served = rnd.sample(UUIDS, rnd.randint(1, len(UUIDS)))
        write_config()
    note(f"{kind}: devices {served}")
    if kind == "reexec":
        gpuq("admin", "restart")  # returns once the new image serves
    else:
        before = starts()
        os.kill(serving_pid(), signal.SIGTERM if kind == "term" else signal.SIGKILL)
        restarted_after(before)
    check(True)


def size_of(name, uuid):
    return next(b["bytes"] for b in json.loads(gpuq("--json", "buffers"))["buffers"]
                if b["name"] == name and b["device"] == served.index(uuid))


def kill_during_put(uuid, name):
    """A put of new bytes into name, gpuqd SIGKILLed while it may run."""
    path, sha = new_bytes(size_of(name, uuid))
    before, pid = starts(), serving_pid()
    note(f"kill during put {ref(name, uuid)} ({uuid})")
    put = subprocess.Popen([f"{BUILD}/gpuq", "--socket", sock, "put", path, ref(name, uuid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rnd.choice([0, 0.001, 0.003, 0.01]))
    os.kill(pid, signal.SIGKILL)
    put.wait()
    restarted_after(before)
    held = model[uuid][name]  # a suspect buffer stays so unless the put ended
    old = None if held == SUSPECT else held[1] if isinstance(held, tuple) else held
    model[uuid][name] = ("torn", old, sha)
    check(True)


def one_event():
    kind = rnd.choices(["alloc", "put", "free", "devices", "kill", "reexec", "term", "drop",
                        "kill_put"], [5, 3, 2, 2, 1, 1, 1, 1, 1])[0]
    uuid = rnd.choice(served)
    mine = model[uuid]
    if kind in ("devices", "kill", "reexec", "term"):
        restart(kind)
        return
    if kind == "kill_put" and mine:
        kill_during_put(uuid, rnd.choice(sorted(mine)))
        return
    if kind == "alloc":
        name = rnd.choice(NAMES)
        if name in mine:
            return
        size = rnd.choice(SIZES)
        path, sha = new_bytes(size)
        note(f"alloc+put {ref(name, uuid)} ({uuid}) {size} B")
        gpuq("alloc", ref(name, uuid), "--bytes", str(size))
        gpuq("put", path, ref(name, uuid))
        mine[name] = sha
    elif kind == "put" and mine:
        name = rnd.choice(sorted(mine))
        path, sha = new_bytes(size_of(name, uuid))
        note(f"put {ref(name, uuid)} ({uuid})")
        gpuq("put", path, ref(name, uuid))
        mine[name] = sha
    elif kind == "free" and mine:
        name = rnd.choice(sorted(mine))
        note(f"free {ref(name, uuid)} ({uuid})")
        gpuq("free", ref(name, uuid))
        del mine[name]
    elif kind == "drop":
        kept = [u for u in UUIDS if u not in served and model[u]]
        if not kept:
            return
        gone = rnd.choice(kept)
        note(f"drop-absent {gone}")
        gpuq("admin", "drop-absent", gone)
        model[gone] = {}
    else:
        return
    check(rnd.random() < 0.2)


def main():
    write_config()
    manager = subprocess.Popen(
        [f"{BUILD}/tests/svc-helper", "supervise-store", sock, str(4 * EVENTS), "50", "64",
         store, "--", f"{BUILD}/gpuqd", "--backend", "host", "--host-devices", "3",
         "--config", conf, "--log-level", "info", "--admin-group",
         subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()],
        stdout=open(f"{tmp}/gpuqd.log", "w"), stderr=subprocess.STDOUT)
    try:
        serving_pid()
        for _ in range(EVENTS):
            one_event()
        check(True)
    except Differs as e:
        print(f"seed {SEED}: {e}\n    events: {tmp}/events; gpuqd's log: {tmp}/gpuqd.log")
        return 1
    finally:
        manager.send_signal(signal.SIGTERM)
        manager.wait()
    print(f"seed {SEED}: {EVENTS} events, {starts()} starts of gpuqd, every buffer as the "
          f"model has it; puts cut short came back with the old bytes {torn['old']} times, "
          f"the new {torn['new']}, suspect {torn['suspect']}")
    shutil.rmtree(tmp)
    return 0


sys.exit(main())
