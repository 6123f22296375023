from perfkit.machine import fitness


def trace(machine_percent, tree_percent, cores=2):
    return {"logical_cores": cores, "system_cpu_percent": machine_percent, "cpu_percent": tree_percent}


def test_a_quiet_machine_is_fit_even_when_the_probe_is_busy():
    assert fitness.unfit(trace([50, 100, 100, 99], [100, 200, 199, 198])) is None
    assert fitness.unfit(None) is None and fitness.unfit(trace([None], [None])) is None


def test_another_process_on_a_core_makes_the_replicate_unfit():
    why = fitness.unfit(
        trace([100, 100, 100, 100], [100, 100, 95, 100])
    )  # the probe on one core, a stranger on the other
    assert why.startswith("machine busy: 1.0 cores used by other processes")


def test_a_load_episode_is_caught_even_when_the_mean_is_low():
    quiet, busy = [10] * 6, [100] * 3  # 3 of 9 samples with a whole other core busy
    why = fitness.unfit(trace(quiet + busy, [20] * 6 + [20] * 3))
    assert why is not None and "more than one core" in why
