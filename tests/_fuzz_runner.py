"""Child process of tests/engine/test_model_fuzz.py: for each GGUF path given, estimate its memory, load it and
generate two tokens, printing one line per case, flushed, so that a death by signal names the case it was in:

  START i            before case i
  OK i               loaded and generated
  REFUSED i <error>  a LocalrtError (InvalidModel, ...): the clean refusal, a 4xx at the HTTP edge
  ERROR i <error>    any other exception: what would have been a hidden 500

Memory is capped (RLIMIT_AS, set by the parent) so that an allocation sized by a metadata number fails here
as a MemoryError instead of swapping the CI machine."""

from __future__ import annotations

import sys


def main(paths: list[str]) -> int:
    from localrt import load_model
    from localrt.errors import LocalrtError
    from localrt.runtime.service import estimate_memory

    for i, path in enumerate(paths):
        print(f"START {i}", flush=True)
        try:
            estimate_memory(path, 32, 8)  # the scheduler's estimate runs before the load, as in the daemon
            model = load_model(path, num_ctx=32, num_batch=8)
            try:
                events = list(model.generate([1, 2, 3], {"num_predict": 2, "temperature": 0}))
                assert events and type(events[-1]).__name__ == "Done", events
            finally:
                model.close()
            print(f"OK {i}", flush=True)
        except LocalrtError as e:
            print(f"REFUSED {i} {type(e).__name__}: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the test
            print(f"ERROR {i} {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
