"""The one C module (the producer's plain-batch encoder), built where a compiler is.

Everything else is in pyproject.toml. ``optional=True``: with no compiler the
install still succeeds and ``storage._fast_encode`` uses its numpy encoder,
which gives the same bytes at a fraction of the speed.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "storage._native",
            ["storage/_native.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        )
    ]
)
