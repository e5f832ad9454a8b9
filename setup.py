"""Package discovery for setuptools; everything else is in pyproject.toml.

probes/, rules/ and reports/ install as diagnose.probes, diagnose.rules and diagnose.reports (the
package-dir mapping in pyproject.toml). setuptools' own `find` names a package after its directory, so it
cannot apply that mapping: the list is derived here instead, from every directory with an __init__.py
under each root, so a new sub-package is in the wheel without being listed (tests/test_packaging.py).
"""

from setuptools import find_packages, setup

# import name -> directory; must match [tool.setuptools] package-dir in pyproject.toml
ROOTS = {"diagnose": "diagnose", "diagnose.probes": "probes", "diagnose.rules": "rules",
         "diagnose.reports": "reports"}


def packages() -> list[str]:
    out: list[str] = []
    for name, where in ROOTS.items():
        out.append(name)
        out.extend(f"{name}.{sub}" for sub in find_packages(where))
    return sorted(out)


if __name__ == "__main__":
    setup(packages=packages())
