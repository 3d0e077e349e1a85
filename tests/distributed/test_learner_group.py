"""``LearnerGroup``: the rendezvous of 2 and 3 learner processes on gloo (rank 0's store
address handed over as the broker would: rank 0 shows it, the others find it), the averaged
gradients equal to one process training on all the data, the clear error of a group a
rank never joins, and re-forming: a killed rank replaced by a new process of the same rank
(rank 0 too, with a new store) forms the group again on generation 2, and a replacement that
never comes fails the survivor past its timeout, naming the missing rank. The store in the
security model: a forged early rank key makes no rank, a generation that is no number is
refused or counted (rank 0 survives it), and the store and gloo listen on the advertised
address (loopback in a loopback run), never every interface."""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
import secrets
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.helpers.ranks import run_ranks
from zrl.distributed.group_store import (
    GENERATION_KEY,
    RemoteStore,
    StoreRefused,
    StoreUnreachable,
    parse_ticket,
)
from zrl.distributed.learner_group import (
    CollectiveError,
    LearnerGroup,
    LearnerGroupError,
    backend_for,
    rank_key,
)

STEPS, PER_RANK = 4, 6  # optimizer steps; samples of each rank per step


def data(world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every step's whole batch (``[STEPS, world_size * PER_RANK, ...]``): rank r trains on
    its slice ``r * PER_RANK:(r + 1) * PER_RANK`` of each."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(STEPS, world_size * PER_RANK, 3, generator=g)
    y = torch.randn(STEPS, world_size * PER_RANK, 2, generator=g)
    return x, y


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def train(net: nn.Module, x: torch.Tensor, y: torch.Tensor, group: LearnerGroup | None) -> None:
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for s in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(net(x[s]), y[s]).backward()
        if group is not None:
            group.average_gradients(net)
        opt.step()


def rank_main(rank: int, world_size: int, folder: str) -> None:
    """One learner process: form the group (rank 0's address through a file, as through the
    broker's STATUS), train its slices, save its parameters."""
    torch.set_num_threads(1)
    where = Path(folder)

    def find_leader() -> str | None:
        path = where / "leader"
        return path.read_text() if path.exists() else None

    group = LearnerGroup(
        rank, world_size, advertise="127.0.0.1", find_leader=find_leader, timeout_s=60
    )
    if group.address is not None:
        (where / "leader.tmp").write_text(group.address)
        (where / "leader.tmp").rename(where / "leader")
    while not group.poll():
        time.sleep(0.02)
    x, y = data(world_size)
    part = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    net = model()
    train(net, x[:, part], y[:, part], group)
    torch.save(net.state_dict(), where / f"rank{rank}.pt")
    group.close()


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_end_with_identical_weights_equal_to_one_process_on_all_data(tmp_path, world_size):
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=rank_main, args=(r, world_size, str(tmp_path)), daemon=True)
        for r in range(world_size)
    ]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * world_size
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    for state in states[1:]:
        assert all(torch.equal(state[k], states[0][k]) for k in state)  # bit-identical
    x, y = data(world_size)
    reference = model()
    train(reference, x, y, None)  # one process, the concatenated data
    before = model().state_dict()
    for k, v in reference.state_dict().items():
        assert not torch.equal(v, before[k])  # the steps moved it
        torch.testing.assert_close(states[0][k], v, rtol=1e-5, atol=1e-6)


def test_a_rank_that_never_comes_fails_the_rendezvous_naming_it():
    leader = LearnerGroup(0, 3, advertise="127.0.0.1", find_leader=lambda: None, timeout_s=1.0)
    assert leader.address is not None and leader.address.startswith("127.0.0.1:")
    joined = LearnerGroup(
        1, 3, advertise="127.0.0.1", find_leader=lambda: leader.address, timeout_s=1.0
    )
    with pytest.raises(LearnerGroupError) as failed:
        while True:  # bounded: both raise past their 1 s
            assert not joined.poll() and not leader.poll()
            time.sleep(0.02)
    message = str(failed.value)
    assert "rank(s) [2] never joined" in message and "group_timeout_s=1" in message, message
    assert joined.store is not None and not leader.ready
    leader.close()
    joined.close()


def test_rank_0_never_found_is_named():
    lost = LearnerGroup(2, 3, advertise="127.0.0.1", find_leader=lambda: None, timeout_s=0.2)
    with pytest.raises(LearnerGroupError, match="rank 0 .* not reached .* never showed"):
        while True:
            assert not lost.poll()
            time.sleep(0.02)


def test_backend_follows_the_device():
    assert backend_for("cpu") == "gloo" and backend_for(torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ValueError, match="rank 3 of 3"):
        LearnerGroup(3, 3, advertise="127.0.0.1", find_leader=lambda: None, timeout_s=1)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (nccl: a GPU per rank)")
def test_nccl_group_of_two_threads_averages_on_their_gpus():
    """The nccl path: the ranks as threads of one process (as ``zrl run --inproc`` runs
    learners), rank r on GPU r."""
    import threading

    leader = LearnerGroup(
        0, 2, advertise="127.0.0.1", find_leader=lambda: None, timeout_s=60, device="cuda:0"
    )
    follower = LearnerGroup(
        1,
        2,
        advertise="127.0.0.1",
        find_leader=lambda: leader.address,
        timeout_s=60,
        device="cuda:1",
    )
    nets = [nn.Linear(2, 1).to(f"cuda:{r}") for r in range(2)]
    for r, net in enumerate(nets):
        for p in net.parameters():
            p.grad = torch.full_like(p, float(r + 1))

    def run(group: LearnerGroup, net: nn.Module) -> None:
        while not group.poll():
            time.sleep(0.02)
        group.average_gradients(net)

    pairs = zip((leader, follower), nets, strict=True)
    threads = [threading.Thread(target=run, args=pair) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for net in nets:
        assert all(torch.all(p.grad == 1.5) for p in net.parameters())
    leader.close()
    follower.close()


def test_weighted_mean_max_and_broadcast_over_two_threads():
    """``average_gradients(weight=...)`` is ``sum_r w_r g_r / sum_r w_r`` (zeros, divisor 0,
    when every weight is 0), ``reduce_max`` the element-wise maximum and ``broadcast`` rank
    0's tensors on every rank: two ranks as threads of one process."""
    leader = LearnerGroup(0, 2, advertise="127.0.0.1", find_leader=lambda: None, timeout_s=60)
    follower = LearnerGroup(
        1, 2, advertise="127.0.0.1", find_leader=lambda: leader.address, timeout_s=60
    )
    groups = (leader, follower)
    grads = {0: torch.tensor([1.0, -2.0, 4.0]), 1: torch.tensor([3.0, 2.0, 0.0])}
    weights = {0: 3.0, 1: 1.0}
    out: dict[int, dict[str, Any]] = {0: {}, 1: {}}

    def run(r: int) -> None:
        group = groups[r]
        while not group.poll():
            time.sleep(0.01)
        net = nn.Linear(3, 1, bias=False)
        net.weight.grad = grads[r].reshape(1, 3).clone()
        out[r]["total"] = group.average_gradients(net, weight=torch.tensor(weights[r]))
        out[r]["mean"] = net.weight.grad.reshape(-1).clone()
        net.weight.grad = grads[r].reshape(1, 3).clone()
        out[r]["zero_total"] = group.average_gradients(net, weight=torch.tensor(0.0))
        out[r]["zero_mean"] = net.weight.grad.reshape(-1).clone()
        out[r]["max"] = group.reduce_max(grads[r].double().clone())
        mine = [torch.full((2,), float(r + 1)), torch.tensor([r], dtype=torch.int64)]
        group.broadcast(mine)
        out[r]["broadcast"] = mine

    try:
        run_ranks(run, timeout=120)
        expected = (3.0 * grads[0] + 1.0 * grads[1]) / 4.0
        for r in (0, 1):
            assert out[r]["total"] == 4.0
            torch.testing.assert_close(out[r]["mean"], expected)
            assert out[r]["zero_total"] == 0.0
            assert torch.equal(out[r]["zero_mean"], torch.zeros(3))
            assert torch.equal(out[r]["max"], torch.tensor([3.0, 2.0, 4.0], dtype=torch.float64))
            ones, zero = out[r]["broadcast"]
            assert torch.equal(ones, torch.ones(2)) and torch.equal(zero, torch.tensor([0]))
    finally:
        leader.close()
        follower.close()


# ----------------------------------------------------------------------------- re-forming


def mean_grads(group: LearnerGroup) -> list[float]:
    """One gradient all-reduce: every gradient of a rank is ``rank + 1``."""
    net = nn.Linear(2, 1)
    for p in net.parameters():
        p.grad = torch.full_like(p, float(group.rank + 1))
    group.average_gradients(net)
    return [float(v) for p in net.parameters() for v in p.grad.reshape(-1)]


def form(group: LearnerGroup) -> None:
    while not group.poll():
        time.sleep(0.02)


def wait_for(path: Path, timeout: float = 240.0) -> None:
    """Until ``path`` exists (another process wrote it); fails past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never written"
        time.sleep(0.02)


def member_main(rank: int, folder: str, part: str) -> None:
    """One learner process of a group of 2: ``victim`` forms the group and waits to be
    killed; ``survivor`` forms it, sees its next all-reduce fail once the victim is killed,
    and re-forms; ``replacement`` (the victim's rank, a new process) joins. Rank 0's store
    address goes through the file ``leader`` (as through the broker: a dead rank 0's stays
    there until its replacement shows a new one)."""
    torch.set_num_threads(1)
    where = Path(folder)

    def find_leader() -> str | None:
        path = where / "leader"
        return path.read_text() if path.exists() else None

    group = LearnerGroup(rank, 2, advertise="127.0.0.1", find_leader=find_leader, timeout_s=120)
    if group.address is not None:
        (where / f"leader.{part}").write_text(group.address)
        (where / f"leader.{part}").rename(where / "leader")
    form(group)
    if part != "replacement":
        first = mean_grads(group)
        (where / f"{part}.formed").write_text(json.dumps(first))
    if part == "victim":
        threading.Event().wait(600)  # until killed
    if part == "survivor":
        wait_for(where / "killed")
        try:
            mean_grads(group)
            raise AssertionError("an all-reduce with a killed rank did not fail")
        except CollectiveError:
            group.rejoin()
        (where / "survivor.rejoining").write_text(str(group.generation))
        form(group)
    report = {"mean": mean_grads(group), "generation": group.generation, "reforms": group.reforms}
    (where / f"{part}.json").write_text(json.dumps(report))
    group.close()


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_replaced_by_a_new_process_reforms_the_group_on_generation_2(
    tmp_path, victim
):
    ctx = mp.get_context("spawn")
    survivor = 1 - victim

    def start(rank: int, part: str) -> Any:
        proc = ctx.Process(target=member_main, args=(rank, str(tmp_path), part), daemon=True)
        proc.start()
        procs.append(proc)
        return proc

    procs: list[Any] = []
    try:
        start(survivor, "survivor")
        doomed = start(victim, "victim")
        wait_for(tmp_path / "victim.formed")
        wait_for(tmp_path / "survivor.formed")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.join(timeout=60)
        (tmp_path / "killed").write_text("")
        wait_for(tmp_path / "survivor.rejoining")  # rank 0's old address still in "leader"
        start(victim, "replacement")
        for proc in procs[::2]:
            proc.join(timeout=240)
        assert [p.exitcode for p in procs] == [0, -signal.SIGKILL, 0]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    first = [
        json.loads((tmp_path / f"{part}.formed").read_text()) for part in ("victim", "survivor")
    ]
    assert first[0] == first[1] == [1.5] * 3
    reports = [
        json.loads((tmp_path / f"{part}.json").read_text()) for part in ("survivor", "replacement")
    ]
    for report in reports:
        assert report == {"mean": [1.5] * 3, "generation": 2, "reforms": 1}, reports


def test_a_survivor_whose_lost_rank_never_comes_back_fails_naming_it():
    """Two ranks as threads; rank 1 leaves (its group closed); rank 0's next all-reduce
    fails, it re-forms on generation 2 and, with no rank 1 coming, fails past its timeout
    naming rank 1."""
    leader = LearnerGroup(0, 2, advertise="127.0.0.1", find_leader=lambda: None, timeout_s=120)
    follower = LearnerGroup(
        1, 2, advertise="127.0.0.1", find_leader=lambda: leader.address, timeout_s=120
    )
    groups = (leader, follower)
    try:
        run_ranks(lambda r: form(groups[r]), timeout=240)
        assert leader.generation == follower.generation == 1
        follower.close()
        with pytest.raises(CollectiveError, match="gradient all-reduce failed"):
            mean_grads(leader)
        leader.timeout_s = 0.5  # learner.group_timeout_s, short here
        leader.rejoin()
        assert leader.generation == 2 and not leader.ready
        with pytest.raises(LearnerGroupError) as failed:
            while True:  # bounded: raises past its 0.5 s
                assert not leader.poll()
                time.sleep(0.02)
        message = str(failed.value)
        assert "not formed on generation 2" in message and "rank(s) [1] never joined" in message
        assert "group_timeout_s=0.5" in message and leader.reforms == 0
    finally:
        leader.close()
        follower.close()


# ------------------------------------------------------------- the store in the security model


def listening(port: int | None = None) -> set[tuple[str, int]]:
    """The TCP addresses this process listens on (``port``: that one only)."""
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and port in (None, c.laddr.port)
    }


def test_a_forged_early_rank_key_makes_no_rank():
    """A process that reaches rank 0's store before rank 1 and writes rank 1's key (without
    the store's key from the broker, or as torch's TCPStore client) is refused and counted;
    the real rank 1 then joins and the group averages between the real ranks."""
    leader = LearnerGroup(0, 2, advertise="127.0.0.1", find_leader=lambda: None, timeout_s=60)
    assert leader.server is not None and leader.address is not None
    host, port, key = parse_ticket(leader.address)
    forger = RemoteStore(host, port, secrets.token_bytes(len(key)), timeout_s=1.0)
    try:
        with pytest.raises(StoreUnreachable):
            forger.request("set", rank_key(1, 1), b"joined", timeout_s=0.5)
        with pytest.raises(RuntimeError):  # the old scheme: a TCPStore on the store's port
            tcp = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=1))
            tcp.set(rank_key(1, 1), "joined")
        assert leader.server.rejected == 1
        assert leader.store is not None and not leader.store.check([rank_key(1, 1)])
        assert not leader.poll()
        follower = LearnerGroup(
            1, 2, advertise="127.0.0.1", find_leader=lambda: leader.address, timeout_s=60
        )
        groups = (leader, follower)
        means: dict[int, list[float]] = {}

        def run(r: int) -> None:
            form(groups[r])
            means[r] = mean_grads(groups[r])

        run_ranks(run, timeout=120)
        assert means == {0: [1.5] * 3, 1: [1.5] * 3}  # ranks 0 and 1: (1 + 2) / 2
        assert leader.generation == follower.generation == 1
        assert leader.server.table.refused == 0 and leader.bad_values == 0
        follower.close()
    finally:
        forger.close()
        leader.close()


def test_a_generation_that_is_no_number_is_refused_or_counted_and_rank_0_survives():
    """A holder of the key that writes a generation that is no number is refused (counted); a
    store that holds one anyway (written past the table's check here) fails no rank: each
    counts it, rank 0 moves the generation on and the group forms on it; a rank that never
    reads a number fails its rendezvous past its timeout, with the count."""
    leader = LearnerGroup(0, 2, advertise="127.0.0.1", find_leader=lambda: None, timeout_s=60)
    assert leader.server is not None and leader.address is not None
    host, port, key = parse_ticket(leader.address)
    holder = RemoteStore(host, port, key, timeout_s=1.0)
    follower = LearnerGroup(
        1, 2, advertise="127.0.0.1", find_leader=lambda: leader.address, timeout_s=60
    )
    try:
        with pytest.raises(StoreRefused):
            holder.set(GENERATION_KEY, "not a number")
        assert leader.server.table.refused == 1
        with leader.server.table.cond:
            leader.server.table.data[GENERATION_KEY] = b"not a number"
        assert not follower.poll()  # connects, reads it: counted, asks again
        assert follower.bad_values == 1 and follower.store is not None
        groups = (leader, follower)
        run_ranks(lambda r: form(groups[r]), timeout=120)
        assert leader.bad_values == 1 and leader.generation == follower.generation == 2
        assert run_means(groups) == {0: [1.5] * 3, 1: [1.5] * 3}
        follower.close()
        lonely = LearnerGroup(
            1, 2, advertise="127.0.0.1", find_leader=lambda: leader.address, timeout_s=0.5
        )
        with leader.server.table.cond:
            leader.server.table.data[GENERATION_KEY] = b"-"
        with pytest.raises(LearnerGroupError):
            while True:  # bounded: raises past its 0.5 s
                assert not lonely.poll()
                time.sleep(0.02)
        assert lonely.bad_values >= 1
        lonely.close()
    finally:
        holder.close()
        follower.close()
        leader.close()


def run_means(groups: tuple[LearnerGroup, ...]) -> dict[int, list[float]]:
    means: dict[int, list[float]] = {}

    def run(r: int) -> None:
        means[r] = mean_grads(groups[r])

    run_ranks(run, ranks=len(groups), timeout=120)
    return means


def test_the_store_and_gloo_listen_on_loopback_in_a_loopback_run():
    before = listening()
    leader = LearnerGroup(0, 2, advertise="127.0.0.1", find_leader=lambda: None, timeout_s=60)
    follower = LearnerGroup(
        1, 2, advertise="127.0.0.1", find_leader=lambda: leader.address, timeout_s=60
    )
    groups = (leader, follower)
    try:
        assert leader.server is not None
        assert listening(leader.server.port) == {("127.0.0.1", leader.server.port)}
        run_ranks(lambda r: form(groups[r]), timeout=120)
        opened = listening() - before
        assert len(opened) >= 2 and {ip for ip, _ in opened} == {"127.0.0.1"}, opened
    finally:
        follower.close()
        leader.close()


def test_the_store_listens_on_the_advertised_address_not_every_interface():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # sends nothing: asks for the routing interface
            address = probe.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        pytest.skip("this host has no interface other than loopback")
    leader = LearnerGroup(0, 2, advertise=address, find_leader=lambda: None, timeout_s=60)
    try:
        assert leader.server is not None
        assert listening(leader.server.port) == {(address, leader.server.port)}
    finally:
        leader.close()
