"""Only the optional compiled accelerator lives here; everything else is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and oxbench uses its numpy
kernels (same numbers, see ``oxbench.evaluation.kernels`` and ``oxbench.index.asmk_file``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "oxbench.evaluation._accel",
            ["src/oxbench/evaluation/_accel.c"],
            extra_compile_args=["-O3", "-ffp-contract=off"],  # gcc/clang flags
            optional=True,
        )
    ]
)
