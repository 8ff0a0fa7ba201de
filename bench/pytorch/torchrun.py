#!/usr/bin/env python3
"""torchrun, as Debian's python3-torch (1.13) ships it, made to start on Python 3.11.

Debian's torchrun crashes at start on Python 3.11: `Std.from_str` looks its value up by
iterating the IntFlag `Std`, and 3.11 no longer yields the zero member, so the default
`--redirects 0 --tee 0` parse to None (AttributeError: 'NoneType' object has no attribute
'get'). This wrapper replaces that one parser and runs torchrun's own main() with the same
arguments; nothing else of torchrun is changed. The benchmarks use it as the baseline.

    /usr/bin/python3 bench/pytorch/torchrun.py --nnodes 1 --nproc_per_node 4 ... train.py ...
"""

from __future__ import annotations

import re
import sys
from typing import Dict, Union

from torch.distributed.elastic.multiprocessing import api


def _from_str(vm: str) -> Union[api.Std, Dict[int, api.Std]]:
    if re.fullmatch(r"\d", vm):
        return api.Std(int(vm))
    if re.fullmatch(r"(\d:\d,)*\d:\d", vm):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm}: want a digit 0-3, or rank:digit pairs like 0:3,1:0")


api.Std.from_str = classmethod(lambda cls, vm: _from_str(vm))  # type: ignore[assignment]

if __name__ == "__main__":
    from torch.distributed import run

    sys.argv[0] = "torchrun"
    run.main()
