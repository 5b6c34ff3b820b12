"""What the binding refuses before C sees it, and how long the memory behind a view lives.

numpy is optional for users; CI sets MUON_REQUIRE_NUMPY=1 so that the numpy tests cannot be
skipped there.
"""

import array
import gc
import os
import sys
import unittest
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import muon_opt as mo  # noqa: E402
from muon_opt import _capi  # noqa: E402

try:
    import numpy as np
except ImportError:  # pragma: no cover - depends on the machine
    np = None
    if os.environ.get("MUON_REQUIRE_NUMPY") == "1":
        raise

U32_MAX = (1 << 32) - 1


def finalized_optimizer(group):
    opt = mo.Optimizer(mo.Config(bucket_size=4096), group[0])
    values = array.array("f", [i / 64.0 for i in range(16 * 8)])
    pid = opt.add_param("w", (16, 8), dtype=mo.Dtype.F32, init=values)
    opt.finalize()
    return opt, pid, values


class IntegersNeverWrap(unittest.TestCase):
    def test_config_fields(self):
        for field, value in [("muon_layout", 1 << 32), ("muon_layout", -1), ("bucket_size", 1 << 64),
                             ("collective_timeout_ms", U32_MAX + 1), ("vocab_size", -5)]:
            with self.subTest(field=field, value=value), self.assertRaises(ValueError) as ctx:
                mo.Config(**{field: value})
            self.assertIn(f"muon_config_t.{field}", str(ctx.exception))
            self.assertIn(str(value), str(ctx.exception))
        self.assertEqual(mo.Config(collective_timeout_ms=U32_MAX).collective_timeout_ms, U32_MAX)
        with self.assertRaises(TypeError):
            mo.Config(bucket_size=4096.0)  # a float is not silently truncated

    def test_param_description(self):
        with mo.HostGroup(1) as group, mo.Optimizer(mo.Config(), group[0]) as opt:
            cases = [
                (dict(shape=(1 << 63, 2)), "shape[0]"),
                (dict(shape=(4, 4), flags=1 << 32), "flags"),
                (dict(shape=(4, 4), tie_group=-1), "tie_group"),
                (dict(shape=(4, 4), dtype=U32_MAX + 2), "dtype"),
                (dict(shape=(8, 4), split_sizes=[4, 1 << 64]), "split_sizes[1]"),
                (dict(shape=(4, 4), init=-8, init_dtype=mo.Dtype.F32), "init address"),
            ]
            for kwargs, field in cases:
                with self.subTest(field=field), self.assertRaises(ValueError) as ctx:
                    opt.add_param("w", **kwargs)
                self.assertIn(f"'w' {field}", str(ctx.exception))
            # Nothing reached the library: the first accepted param still gets id 0.
            self.assertEqual(opt.add_param("w", (4, 4)), 0)

    def test_ids_buckets_and_group_sizes(self):
        with mo.HostGroup(1) as group:
            opt, pid, _ = finalized_optimizer(group)
            with opt:
                # 2**32 + pid would wrap to a valid id in ctypes.
                with self.assertRaises(ValueError) as ctx:
                    opt.grad_ready((1 << 32) + pid)
                self.assertIn("muon_optimizer_grad_ready argument 2", str(ctx.exception))
                with self.assertRaises(ValueError):
                    opt.wait_params(-1)
                with self.assertRaises(ValueError):
                    opt.param_view((1 << 32) + pid)
        with self.assertRaises(ValueError):
            mo.HostGroup((1 << 32) + 2)
        with self.assertRaises(mo.MuonError) as ctx:
            mo.HostGroup(mo.MUON_MAX_HOST_GROUP_SIZE + 1)  # in range for C, refused by the library
        self.assertIs(ctx.exception.status, mo.Status.OUT_OF_RANGE)

    def test_raw_functions_are_checked_too(self):
        with self.assertRaises(ValueError):
            mo.status_string(1 << 32)
        with self.assertRaises(ValueError):
            mo.mxfp8_scale_shape(-1, 32)


class StringsNeverTruncate(unittest.TestCase):
    def test_names_and_paths_with_nul(self):
        with mo.HostGroup(1) as group:
            opt, _, _ = finalized_optimizer(group)
            with opt:
                with self.assertRaises(ValueError) as ctx:
                    opt.save("/tmp/ckpt\0evil")
                self.assertIn("embedded NUL byte at offset 9", str(ctx.exception))
        with mo.HostGroup(1) as group, mo.Optimizer(mo.Config(), group[0]) as opt:
            with self.assertRaises(ValueError) as ctx:
                opt.add_param("layer.0\0.weight", (4, 4))
            self.assertIn("embedded NUL", str(ctx.exception))
            with self.assertRaises(TypeError):
                opt.add_param(b"w", (4, 4))
            self.assertEqual(opt.add_param("layer.0.weight", (4, 4)), 0)


class ViewsOutliveClose(unittest.TestCase):
    def test_memoryview_slices_read_the_params_after_close(self):
        with mo.HostGroup(1) as group:
            opt, pid, values = finalized_optimizer(group)
            view = opt.param_view(pid)
            tail = view.data[64:]  # a slice: its own memoryview on the same memory
            opt.close()
            del view
            gc.collect()
            self.assertEqual(tail.tolist(), values.tolist()[64:])
            with self.assertRaises(mo.MuonError):
                opt.zero_grad()  # the optimizer itself is closed

    def test_memory_is_freed_once_the_last_view_goes(self):
        with mo.HostGroup(1) as group:
            opt, pid, _ = finalized_optimizer(group)
            view = opt.param_view(pid)
            storage = weakref.ref(opt._storage)  # the C handle's owner
            opt.close()
            gc.collect()
            self.assertIsNotNone(storage(), "a live view keeps the memory")
            del view
            gc.collect()
            self.assertIsNone(storage(), "the last view's end frees it")
            opt2, _, _ = finalized_optimizer(group)
            storage = weakref.ref(opt2._storage)
            opt2.close()
            self.assertIsNone(storage(), "without views, close frees at once")

    @unittest.skipIf(np is None, "numpy is not installed")
    def test_numpy_arrays_read_the_params_after_close(self):
        with mo.HostGroup(1) as group:
            opt, pid, values = finalized_optimizer(group)
            view = opt.param_view(pid)
            weights = np.frombuffer(view.data, dtype=np.float32).reshape(16, 8)
            grads = np.frombuffer(view.grad, dtype=np.float32)
            grads[:] = 1.0
            opt.close()
            del view
            gc.collect()
            # Filling fresh allocations would expose freed memory under the arrays.
            noise = [bytearray(b"\xff" * 4096) for _ in range(256)]
            np.testing.assert_array_equal(weights.ravel(), np.array(values, dtype=np.float32))
            np.testing.assert_array_equal(grads, np.ones(128, dtype=np.float32))
            del noise


if __name__ == "__main__":
    unittest.main()
