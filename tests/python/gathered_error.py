"""zoe.torch.gathered() on a model whose units do not all fit the device budget at once: the fetch
that finds no room raises zoe.Error, and the block releases what it had fetched before: neither
the wrapper nor the engine holds any unit fetched afterwards (left fetched, they would keep their
device memory and every later fetch of them would skip the gather)."""
import sys

import torch

import zoe
import zoe.torch

LAYERS = 12  # 16.6 kB gathered each: 5 fit 150 kB beside the persistent state, 12 do not


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(LAYERS)])
    engine = zoe.Engine({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0,
                                               "stage3_max_reuse_distance": 0,
                                               "offload_param": {"device": "cpu"},
                                               "offload_optimizer": {"device": "cpu"}},
                         "zoe": {"device_memory_budget": 150000}})
    zoe.torch.wrap(model, engine)
    problems = []
    try:
        with zoe.torch.gathered(model):
            problems.append("every unit was gathered: the budget no longer makes a fetch fail")
    except zoe.Error as e:
        if "budget" not in str(e):
            problems.append(f"unexpected error: {e}")
    held = [u.index for u in model._zoe.units if u.refs]
    if held:
        problems.append(f"units {held} are still fetched after the failed gathered()")
    for unit in model._zoe.units:  # the engine's own count: releasing once more must be refused
        try:
            engine.release(unit.index)
            problems.append(f"the engine still had unit {unit.index} fetched")
        except zoe.Error as e:
            if "not fetched" not in str(e):
                problems.append(f"release of unit {unit.index}: {e}")
    engine.close()
    for p in problems:
        print("FAIL:", p)
    print(f"{'PASS' if not problems else 'FAIL'}: a failed gathered() releases what it fetched")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
