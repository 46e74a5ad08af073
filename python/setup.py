"""Only the wheel's platform tag: the binaries inside need this glibc and x86-64, not any
particular Python (`cargo xtask wheel` reads the glibc version they require off their symbols
and passes the tag as MYSTIQUE_WHEEL_PLAT)."""
import os

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        # Binaries inside: not a pure-Python wheel.
        self.root_is_pure = False

    def get_tag(self):
        plat = os.environ.get("MYSTIQUE_WHEEL_PLAT")
        if not plat:
            raise SystemExit("build the wheel with `cargo xtask wheel` (MYSTIQUE_WHEEL_PLAT is unset)")
        return "py3", "none", plat


setup(cmdclass={"bdist_wheel": PlatformWheel})
