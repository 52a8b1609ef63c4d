"""The in-memory bucket's listing (`MemoryResults.keys`), which checking a simulated run calls once per site: its
keys under a prefix, in order, however the objects came or went since the last listing."""

from sim.memory import MemoryResults


def test_keys_under_a_prefix_in_order_after_puts_renames_and_direct_writes():
    r = MemoryResults()
    for key in ("b/2/result.json", "a/1/result.json", "b/1/part-1", "b/10/result.json", "c/1/x"):
        r.put_staged(key, b"x")
    assert r.keys("b/") == ["b/1/part-1", "b/10/result.json", "b/2/result.json"]
    assert r.keys("b/1/") == ["b/1/part-1"] and r.keys("z/") == [] and r.keys("") == sorted(r.objects)
    assert r.put_new("b/1/result.json", b"y") and r.keys("b/1/") == ["b/1/part-1", "b/1/result.json"]
    moved = r.set_aside("b/1/part-1", "stale")  # same count of objects, one key renamed
    assert moved is not None and "b/1/part-1" not in r.keys("b/1/") and moved in r.keys("")
    r.objects["b/1/zz"] = b"z"  # written past the methods, as some tests do
    assert r.keys("b/1/")[-1] == "b/1/zz"
