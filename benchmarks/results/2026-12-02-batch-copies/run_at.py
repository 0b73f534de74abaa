import sys, types, runpy
root = sys.argv[1]
pkg = types.ModuleType("veil"); pkg.__path__ = [root]; sys.modules["veil"] = pkg
sys.argv = [sys.argv[2]] + sys.argv[3:]
runpy.run_module(sys.argv[0], run_name="__main__")
