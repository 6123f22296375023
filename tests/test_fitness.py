import pytest

from perfkit.machine import fitness

STRICT = fitness.Limits(mode=fitness.STRICT)


def trace(machine_percent, tree_percent, cores=2, interval_s=0.25):
    """Samples every interval_s: the machine's CPU in % of all cores, the probe tree's in % of one core."""
    return {
        "logical_cores": cores,
        "interval_s": interval_s,
        "t": [i * interval_s for i in range(len(machine_percent))],
        "system_cpu_percent": machine_percent,
        "cpu_percent": tree_percent,
    }


def test_a_quiet_machine_is_fit_even_when_the_probe_is_busy():
    assert fitness.unfit(trace([50, 100, 100, 99, 100], [100, 200, 199, 198, 200]), limits=STRICT) is None
    assert fitness.unfit(None) is None and fitness.unfit(trace([None], [None]), limits=STRICT) is None


def test_another_process_on_a_core_makes_the_replicate_unfit_when_strict():
    # the probe on one core, a stranger on the other
    busy = trace([100] * 9, [100, 100, 95, 100, 100, 100, 100, 100, 100])
    why = fitness.unfit(busy, limits=STRICT)
    assert why.startswith("machine busy: 1.0 of 2 cores used by other processes")


def test_on_a_shared_machine_load_is_recorded_and_never_unfit():
    busy = trace([100] * 9, [100] * 9)  # the probe's thread on one core, a stranger on the other
    busy["foreign_processes"] = [{"pid": 1234, "name": "python3", "percent": 98.0}]
    assert fitness.unfit(busy) is None  # the default mode: measured through
    assert fitness.load(busy) == {"cores": 1.0, "of": 2, "busy_share": 0.0, "top": busy["foreign_processes"]}
    both = trace([100] * 9, [10] * 9)  # strangers on both cores: still evidence, the verdict allows for it
    assert fitness.unfit(both) is None and fitness.load(both)["cores"] == 1.9 and fitness.load(both)["busy_share"] == 1
    assert fitness.load(trace([None], [None])) is None
    said = fitness.load_words([fitness.load(busy), fitness.load(quiet()), None])
    assert said == "other processes used 1.0 of 2 cores (pid 1234 python3, 98%) during 1 of 3 replicates"
    assert fitness.load_words([fitness.load(quiet())]) is None  # 0.0 cores is not worth a word


def test_the_foreign_processes_are_the_busiest_outside_the_tree_over_the_trace():
    import time

    from perfkit.machine.utilization import foreign_processes

    now = time.time()
    before = {1: ("init", 5.0, 0.0), 7: ("python3", 10.0, now - 100), 8: ("probe", 1.0, now - 50), 9: ("x", 3.0, 0.0)}
    after = {
        1: ("init", 5.001, 0.0),  # housekeeping, under 1% of a core
        7: ("python3", 11.9, now - 100),  # 1.9 CPU s in 2 s: 95%
        8: ("probe", 2.9, now - 50),  # the probe's own tree
        9: ("x", 0.4, now - 1),  # the pid was reused: counted from the new process's birth
        10: ("late", 60.0, now - 500),  # not readable at the start: its lifetime is not this trace's
    }
    got = foreign_processes(before, after, mine={8}, seconds=2.0)
    assert got == [{"pid": 7, "name": "python3", "percent": 95.0}, {"pid": 9, "name": "x", "percent": 20.0}]


def test_a_load_episode_is_caught_even_when_the_mean_is_low():
    quiet, busy = [10] * 9, [100] * 8  # two of five seconds with a whole other core busy
    why = fitness.unfit(trace(quiet + busy + quiet[:4], [20] * 21), limits=STRICT)
    assert why is not None and "more than 1 cores 40% of the time" in why


def test_a_process_the_tree_finds_late_is_not_foreign_load():
    # the kernel runs a core from the start; the tree finds it at the next scan and counts it in a lump
    machine = [50] * 9
    tree = [0, 0, 0, 400, 100, 100, 100, 100, 100]
    assert fitness.unfit(trace(machine, tree), limits=STRICT) is None


def test_only_the_time_the_cells_ran_counts():
    t = trace([100] * 5 + [10] * 8, [0] * 5 + [20] * 8)  # a stranger during start-up, then quiet
    assert fitness.unfit(t, limits=STRICT) is not None
    assert fitness.unfit(t, window=(1.25, 3.0), limits=STRICT) is None
    assert fitness.load(t, window=(1.25, 3.0))["cores"] < 0.1


def test_the_mode_and_the_limits_are_shares_of_the_machine_and_can_be_set():
    one_core_busy = trace([100 / 16 + 100 / 16] * 9, [100] * 9, cores=16)  # the probe and one stranger, of 16
    assert fitness.unfit(one_core_busy, limits=STRICT) is None  # a core of 16 is not a busy machine; of 2 it is
    assert fitness.unfit(trace([100] * 9, [100] * 9), limits=STRICT) is not None
    limits = fitness.Limits.parse({"foreign_share": 0.05}, "[tool.perfkit] fitness")
    assert limits.strict  # a table of limits is the strict mode with those limits
    assert fitness.unfit(one_core_busy, limits=limits).startswith("machine busy: 1.0 of 16 cores")
    assert fitness.Limits.parse("strict", "f").strict and not fitness.Limits.parse("shared", "f").strict
    assert not fitness.Limits.parse({"mode": "shared", "episodes": 0.5}, "f").strict
    assert not fitness.LIMITS.strict  # the default: a shared machine
    with pytest.raises(ValueError, match=r"fitness.foreign_share must be a share from 0 to 1, got 2"):
        fitness.Limits.parse({"foreign_share": 2}, "[tool.perfkit] fitness")
    with pytest.raises(ValueError, match="has no key foreign_cores"):
        fitness.Limits.parse({"foreign_cores": 0.5}, "[tool.perfkit] fitness")
    with pytest.raises(ValueError, match=r'fitness must be "shared", "strict" or a table of limits, got \'lax\''):
        fitness.Limits.parse("lax", "[tool.perfkit] fitness")


def test_the_default_threads_are_one_on_a_shared_machine_and_the_cores_when_strict(monkeypatch):
    monkeypatch.setattr(fitness, "cpus", lambda: (0, 1, 2, 3))
    assert fitness.threads_for(1, {}) == 1 and fitness.threads_for(2, {}) == 1
    assert fitness.threads_for(1, {}, strict=True) == 4 and fitness.threads_for(2, {}, strict=True) == 2
    assert fitness.threads_for(1, {"OMP_NUM_THREADS": "3"}) == 3  # the user's own, in either mode


def quiet(n=9):
    return trace([10] * n, [20] * n)


def test_swapping_a_falling_clock_and_a_throttled_or_shared_gpu_are_unfit():
    t = quiet()
    t["swap_bytes"] = [0] * 4 + [64 * 2**20] * 5
    assert fitness.unfit(t).startswith("swapping: 64 MiB")  # in either mode
    assert fitness.unfit(t, limits=STRICT).startswith("swapping: 64 MiB")
    t = quiet()
    t["cpu_freq_mhz"] = [3000] * 6 + [1200] * 3
    assert fitness.unfit(t) == "CPU clock fell to 1200 MHz (median 3000 MHz)"
    t = quiet()
    t["gpus"] = [{"index": 0, "throttle_reasons": [0, 0, 0x1, 0x4, 0x4, 0, 0, 0, 0], "gpu_pids": [[7]] * 9}]
    t["tree_pids"] = [7]
    assert fitness.unfit(t) == "GPU 0 throttled (power cap) 22% of the time"
    t["gpus"][0]["throttle_reasons"] = [0x1] * 9  # idle is not throttling
    assert fitness.unfit(t) is None
    t["gpus"][0]["gpu_pids"] = [[7, 4242]] * 9
    assert fitness.unfit(t) == "GPU 0 used by 1 other processes (pid 4242)"


def test_free_cores_counts_what_others_leave_on_the_cpus_asked_about(monkeypatch):
    import psutil

    monkeypatch.setattr(fitness, "cpus", lambda: tuple(range(8)))
    busy = [100.0, 100.0] + [0.0] * 6  # CPUs 0 and 1 taken by another process
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None, percpu=False: busy)
    assert fitness.free_cores() == 6
    assert fitness.free_cores(on=(0, 1)) == 0 and fitness.free_cores(on=(4, 5, 6, 7)) == 4


def test_executions_at_once_get_disjoint_cpus_and_threads_that_fit():
    assert fitness.slots(2, (0, 1, 2, 3)) == [(0, 1), (2, 3)]
    assert fitness.slots(3, (0, 1, 2, 3, 4, 5, 6)) == [(0, 1), (2, 3, 4), (5, 6)]
    assert fitness.slots(1, (2, 5)) == [(2, 5)]  # an affinity with holes (taskset, a container)
    assert fitness.slots(3, (0, 1)) == [(0,), (1,), (0,)]  # more than CPUs: shared, and judged so
    assert fitness.at_once(2, 1, 2) == 2 and fitness.at_once(2, 2, 2) == 1 and fitness.at_once(4, 2, 8) == 4
    assert fitness.cpu_list((0, 1, 2, 3, 6, 8, 9)) == "0-3,6,8-9" and fitness.cpu_list((5,)) == "5"


def _spin(cpu: int):
    """A process outside any probe's tree burning one CPU."""
    import subprocess
    import sys

    code = f"import os; os.sched_setaffinity(0, [{cpu}])\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_for_quiet(cpus: tuple[int, ...], pid: int, bound_s: float = 60.0) -> None:
    """Wait until another job leaves `cpus` alone for a second: a busy process beside the probe is only
    told from one on its CPU while neither CPU is busy already. When the machine is never quiet within
    `bound_s` (another job keeps a core busy), the test is skipped, saying so: what it checks cannot be
    seen then, and a shared machine is a case the rest of the suite measures through."""
    import time

    from perfkit.machine.utilization import Sampler

    deadline = time.monotonic() + bound_s
    while True:
        sampler = Sampler(interval_s=0.1, pid=pid, cpus=cpus).start()
        time.sleep(1.0)
        load = max(fitness.foreign_cores(sampler.stop()), default=0.0)
        if load < 0.2 * len(cpus):
            return
        if time.monotonic() >= deadline:
            pytest.skip(f"CPUs {cpus} were never quiet for a second in {bound_s:g} s ({load:.2f} cores busy)")


@pytest.mark.alone  # waits for both CPUs to be quiet: beside another test it waits for that test to end
@pytest.mark.skipif(len(fitness.cpus()) < 2, reason="needs two CPUs to pin to")
def test_a_sibling_on_its_own_cpu_is_not_foreign_load_but_a_stranger_on_mine_is():
    """Real processes: the trace of an execution pinned to one CPU reads that CPU's load. A busy process
    on the other CPU (a sibling execution of the run, or a worker's) leaves it fit; one on its CPU does not."""
    import subprocess
    import sys
    import time

    from perfkit.machine.utilization import Sampler

    mine, other = fitness.cpus()[:2]

    def trace_with(spinner_cpu):
        execution = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # idle, pinned nowhere
        _wait_for_quiet((mine, other), execution.pid)
        spinner = _spin(spinner_cpu)  # not in the execution's tree: its sibling, or a stranger
        try:
            time.sleep(0.5)
            sampler = Sampler(interval_s=0.1, pid=execution.pid, cpus=(mine,)).start()
            time.sleep(2.5)
            return sampler.stop()
        finally:
            for p in (spinner, execution):
                p.kill()
                p.wait()

    for _ in range(3):  # another job that starts during a trace spoils that pair: take another
        beside = trace_with(other)
        on_mine = trace_with(mine)
        if fitness.unfit(beside, limits=STRICT) is None:
            break
    assert beside["cpus"] == [mine] and beside["logical_cores"] == 1
    assert fitness.unfit(beside, limits=STRICT) is None, fitness.foreign_cores(beside)
    assert (fitness.unfit(on_mine, limits=STRICT) or "").startswith("machine busy: "), fitness.foreign_cores(on_mine)
    # the stranger on its CPU is named, by pid and name, as the load's maker
    assert fitness.load(on_mine)["cores"] > 0.5 and any(p["percent"] > 50 for p in on_mine["foreign_processes"])
