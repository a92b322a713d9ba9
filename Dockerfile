# `aiayn serve` on the CPU. Build, then run with a checkpoint mounted at /model:
#
#   docker build -t aiayn-serve .
#   docker run --rm -p 8000:8000 -v "$PWD/runs/demo:/model:ro" -e AIAYN_API_KEY=... aiayn-serve
#
# Arguments after the image name replace the default `--checkpoint /model` and are appended
# to `aiayn serve --host 0.0.0.0 --port 8000` (docs/deploying.md, "Docker").
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Every version the image installs is pinned in docker/constraints.txt (the versions the
# tests passed with; scripts/docker_constraints.py writes it), so that a rebuild installs
# the same packages as the last one.
COPY docker/constraints.txt /constraints.txt

# torch first, from PyTorch's CPU index: from PyPI, `pip install .` would pull the CUDA
# build and several GB of CUDA libraries. Its own layer, so that it is cached across
# rebuilds of the source. `+cpu` names the CPU build; its dependencies come from PyPI,
# pinned like the rest.
RUN pip install -c /constraints.txt --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple torch==2.13.0+cpu

# Only what the package needs to build (.dockerignore keeps the rest out of the context).
WORKDIR /build
COPY pyproject.toml README.md ./
COPY src ./src
# A regular (not editable) install, so that the source tree can go.
RUN pip install -c /constraints.txt ".[serve]" && rm -rf /build /constraints.txt

# Never run a network service as root.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin aiayn
USER aiayn
WORKDIR /home/aiayn

# The checkpoint (or CTranslate2 export) to serve, mounted read-only at run time.
VOLUME ["/model"]
EXPOSE 8000

# /health needs no API key; python's urllib, since the slim image has no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; r = urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4); sys.exit(r.status != 200)"]

ENTRYPOINT ["aiayn", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--checkpoint", "/model"]
