"""The Triton compile watch names each new kernel variant by its kernel and constexpr values."""

from types import SimpleNamespace

from triton import knobs

from onebit.kernels import compile_watch


def test_the_hook_counts_and_names_variants_and_keeps_the_previous_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda *a, **kw: seen.append(kw["fn"].name))
    monkeypatch.setattr(compile_watch, "_installed", False)
    assert compile_watch.install() and compile_watch.install()  # a second install does not chain twice
    before = compile_watch.compiled
    fn = SimpleNamespace(name="matvec", jit_function=SimpleNamespace(arg_names=["x", "w", "n", "BLOCK"]))
    knobs.runtime.jit_cache_hook(key="k1", repr="", fn=fn, compile={"constants": {(3,): 64, (2,): 1}},
                                 is_manual_warmup=False, already_compiled=False)
    knobs.runtime.jit_cache_hook(key="k2", repr="", fn=fn, compile={"constants": {(3,): 128}},
                                 is_manual_warmup=False, already_compiled=False)
    assert compile_watch.compiled == before + 2
    assert compile_watch.since(before) == ["matvec(BLOCK=64, n=1)", "matvec(BLOCK=128)"]
    assert compile_watch.since(before + 2) == []
    assert seen == ["matvec", "matvec"]  # the hook that was there before still runs


def test_a_hook_call_it_cannot_read_is_still_counted(monkeypatch):
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(compile_watch, "_installed", False)
    compile_watch.install()
    before = compile_watch.compiled
    assert knobs.runtime.jit_cache_hook(key="k", fn=object(), compile={"constants": 3}) is None
    assert compile_watch.since(before) == ["?"]
