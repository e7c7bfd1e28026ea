"""``python3 -m bench.gpu_check``: kept for GPU sessions; runs :func:`bench.gpu.check.main`."""

if __name__ == "__main__":
    from bench.gpu.check import main

    raise SystemExit(main())
