"""A stand-in for `singularity` on a machine without it: checks the command line the job script gives it,
logs it (one JSON line per call to `$TAU2_TEST_SINGULARITY_LOG`), then runs the command.

Accepted: exec --no-home --writable-tmpfs --nv [--bind SRC:DST[,SRC:DST...]] (--env K=V)... IMAGE CMD...
The image must be an existing file and every bind source an existing folder; the command runs with the
host's environment plus the --env variables, as a container would see them. Anything else exits 64.
"""

import json
import os
import sys


def fail(message: str) -> None:
    print(f"singularity stand-in: {message}: {sys.argv[1:]}", file=sys.stderr)
    sys.exit(64)


def main() -> None:
    args = sys.argv[1:]
    if args[:4] != ["exec", "--no-home", "--writable-tmpfs", "--nv"]:
        fail("expected exec --no-home --writable-tmpfs --nv")
    rest, binds, env = args[4:], [], {}
    while rest and rest[0] in ("--bind", "--env"):
        if len(rest) < 2:
            fail(f"{rest[0]} without a value")
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--bind":
            for item in value.split(","):
                src = item.split(":")[0]
                if not os.path.isdir(src):
                    fail(f"bind source {src} is not a folder")
                binds.append(item)
        else:
            key, sep, val = value.partition("=")
            if not sep or not key:
                fail(f"--env {value} is not KEY=VALUE")
            env[key] = val
    if len(rest) < 2:
        fail("expected IMAGE CMD...")
    image, cmd = rest[0], rest[1:]
    if not os.path.isfile(image):
        fail(f"image {image} does not exist")
    with open(os.environ["TAU2_TEST_SINGULARITY_LOG"], "a") as log:
        log.write(json.dumps({"binds": binds, "env": env, "image": image, "cmd": cmd}) + "\n")
    os.execvpe(cmd[0], cmd, {**os.environ, **env})


if __name__ == "__main__":
    main()
