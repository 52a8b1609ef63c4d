"""`python -m cloud_init bake`: print the node image's bake script (infra/packer/bake.sh is this output)."""

import sys

from cloud_init.render import render_bake

if __name__ == "__main__":
    if sys.argv[1:] != ["bake"]:
        print("usage: python -m cloud_init bake", file=sys.stderr)
        raise SystemExit(2)
    sys.stdout.write(render_bake())
