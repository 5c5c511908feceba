# The two set-up commands: `make serve` runs the server, `make test` passes the tests.
VENV := .venv
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
TEST_WORKERS ?= $(shell expr $$(nproc) + 1)

.PHONY: serve serve-media test lint bench

$(STAMP): pyproject.toml scripts/bootstrap.sh
	scripts/bootstrap.sh

serve: $(STAMP)
	$(VENV)/bin/duplex serve --host $(HOST) --port $(PORT)

# the same, with the tiny random-weight image and video pipelines (docs/images-video.md)
serve-media: $(STAMP)
	$(VENV)/bin/duplex serve --host $(HOST) --port $(PORT) --image-model tiny --video-model tiny

# The suite starts hundreds of Python processes (servers, workers, clients): each compiles
# the project's modules again where a host sets PYTHONDONTWRITEBYTECODE (about 0.7 s of CPU a
# process on the 2-core machine), so the tests run with bytecode caching on.
# pytest exits 5 when it collects nothing: for us that is a failure, never a pass.
# One pytest-xdist worker more than the cores (3 on the 2-core machine): most tests wait on
# sockets and real time (docs/testing.md); worksteal evens out the long end-to-end tests.
test: $(STAMP)
	$(VENV)/bin/ruff check duplex tests bench
	$(VENV)/bin/ruff format --check duplex tests bench
	@env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist worksteal; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

lint: $(STAMP)
	$(VENV)/bin/ruff check --fix duplex tests bench
	$(VENV)/bin/ruff format duplex tests bench

bench: $(STAMP)
	$(VENV)/bin/python bench/actors.py
