# elasticd — see README.md. Every target works on a fresh Debian machine with Go >= 1.26.
GO      ?= go
BIN     := bin/elasticd
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# go-nvml's header marks many functions deprecated; their warnings say nothing about our code.
# Added to whatever CGO_CFLAGS the environment sets (Go's default, -O2 -g, when none), so
# that `make lint` and `make test` stay quiet there too. Outside make, pass the same flag:
#   CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go vet ./...
export CGO_CFLAGS := $(or $(CGO_CFLAGS),-O2 -g) -Wno-deprecated-declarations
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# Stamped by the linker, so that `elasticd version` names its commit even where Go's own VCS
# stamping is off (a build outside a checkout, -buildvcs=false).
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

.PHONY: all build release test test-go test-python test-deps demo demo-cloud bench bench-capacity bench-scale bench-go bench-compare bench-compare-hosts bench-pytorch soak soak-ci fuzz lint clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/elasticd
	$(GO) build -o bin/train ./examples/train

# Versioned tarballs in dist/ (linux amd64 and arm64: the binary with version and commit, the
# Python package, the price example, the README) and dist/SHA256SUMS, for the Terraform modules'
# elasticd_release_path (the tarball itself, uploaded by the module) or elasticd_release_url and
# elasticd_release_sha256 (published). ARCHES=amd64 for one; arm64 on an amd64
# machine needs gcc-aarch64-linux-gnu (NVML is cgo).
release:
	VERSION=$(VERSION) COMMIT=$(COMMIT) OUT=dist sh scripts/release.sh

# The whole suite, with the race detector, as CI runs it. test-deps installs what the tests
# need beyond Go (OpenSSH for the ssh launcher's real-sshd tests, Debian's python3-torch and
# python3-pytest for the PyTorch tests); it does nothing when present.
test: test-deps test-go test-python

test-go:
	$(GO) test -race -count=1 -timeout 30m ./...

# The Python package's tests (python/tests), under Debian's interpreter, which has torch: a
# python3 earlier on PATH may not (override with PYTHON=...).
PYTHON ?= /usr/bin/python3
test-python: build
	cd python && ELASTICD_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q -p no:cacheprovider tests

test-deps:
	scripts/install-test-deps.sh

# An elastic job on this machine: 4 workers train the demo model; at step 150 one of them is
# killed with SIGKILL; the job goes on with 3 from the last commit; 3 s later the dead slot's
# cooldown ends, it comes back and the job grows to 4 again; it ends with the test accuracy.
# The workers commit every 10 steps, so the failure rolls back the steps since the last
# commit. The hosts count as spot capacity priced by examples/prices.yaml: the last line gives
# the cost, the savings against on-demand and the cost of the rolled-back work. While it
# runs, the live page is at http://127.0.0.1:$(DEMO_PORT)/ (DEMO_STEPS longer to watch it): the
# world size, step rate, loss and cost over time, step X of DEMO_STEPS and the time to go.
DEMO_PORT  ?= 29400
DEMO_STEPS ?= 800
demo: build
	@echo "== elasticd run -np 4 --min-np 2: rank 1 will be killed with SIGKILL at step 155; live page at http://127.0.0.1:$(DEMO_PORT)/ =="
	./$(BIN) run -np 4 --min-np 2 --blacklist-cooldown-range 3s,30s \
		--listen 127.0.0.1:$(DEMO_PORT) --local-spot --prices examples/prices.yaml -- \
		./bin/train --steps $(DEMO_STEPS) --step-delay 10ms --commit-every 10 --die-at-step 155

# The job steering its fleet, on a cloud simulated on this machine (--provider sim): two spot
# hosts of 2 slots, real elasticd agents on 127.0.0.2-.5. At 8 s spot runs short: one host
# gets an interruption notice and is reclaimed 5 s later, and the spot group cannot launch
# another. After --fallback-after (10 s here) the job falls back on one on-demand host; when
# spot returns (40 s) the job moves back to spot at a commit, with no step lost, and the
# on-demand group goes back to zero. When the job ends both groups go to zero. The last lines
# give the cost against all-on-demand and what the fallback cost and kept going.
demo-cloud: build
	@echo "== elasticd run --provider sim --manage-capacity --sim-fallback: spot runs out at 8 s and returns at 40 s; live page at http://127.0.0.1:$(DEMO_PORT)/ =="
	./$(BIN) run --provider sim -np 4 --min-np 2 --slots-per-host 2 --listen 127.0.0.1:$(DEMO_PORT) \
		--manage-capacity --sim-fallback --fallback-after 10s --sim-interrupt-warning 5s \
		--sim-scenario examples/sim/spot-runs-out.txt -- \
		./bin/train --steps 6000 --step-delay 10ms --commit-every 10 --log-every 1000

# The figures in docs/benchmarks.md: allreduce with 2 and 4 ranks, 4 KB to 256 MB; recovery of
# a 4-worker job; leaving an agent host on a spot notice; then the Go benchmarks (allreduce, and rendezvous of 64-4096 workers).
BENCH_SIZES ?= 4KB,64KB,1MB,16MB,64MB,256MB
bench: build
	./$(BIN) bench allreduce --np 2 --sizes $(BENCH_SIZES)
	./$(BIN) bench allreduce --np 4 --sizes $(BENCH_SIZES)
	./$(BIN) bench recovery --np 4 --runs 5
	./$(BIN) bench notice --runs 7
	$(MAKE) bench-go
	$(MAKE) bench-capacity

# --manage-capacity on the simulated cloud: a job's end to its group at zero, the fallback
# ordered to the job back at -np, steps lost moving back to spot, on-demand hours against the
# least (docs/benchmarks.md, "Steering the fleet"); about a minute per job.
bench-capacity:
	$(GO) test -run '^$$' -bench SimFallback -benchtime 5x -count 1 ./cmd/elasticd/

bench-go:
	$(GO) test -run '^$$' -bench . -benchtime 20x -count 1 ./allreduce/
	$(GO) test -run '^$$' -bench Reset -benchtime 3x -count 1 ./driver/rendezvous/

# elasticd, Gloo, torch.distributed's gloo (under $(PYTHON)), Open MPI over TCP and over shared
# memory, interleaved on this machine, ROUNDS times, then medians and ratios side by side
# (installs Gloo and Open MPI with apt-get; torch must be there). Raw lines stay in $(COMPARE_OUT).
ROUNDS      ?= 3
COMPARE_OUT ?= bench-compare.jsonl
bench-compare: build
	ROUNDS=$(ROUNDS) TORCH_PYTHON=$(PYTHON) bench/baselines/run.sh > $(COMPARE_OUT)
	./$(BIN) bench report $(COMPARE_OUT)

# The same across simulated hosts (docs/benchmarks.md, "Across hosts"): HOSTS network
# namespaces joined by veth through a bridge in a switch namespace, all made and removed by
# run.sh (root, iproute2), PER_HOST ranks in each (every count in the list, interleaved), so
# that ranks of different hosts talk TCP; LINK_QDISC (run.sh) models a link.
HOSTS       ?= 2
PER_HOST    ?= 1 2
HOSTS_SIZES ?= 4096 65536 1048576 16777216 67108864
COMPARE_HOSTS_OUT ?= bench-compare-hosts.jsonl
bench-compare-hosts: build
	HOSTS=$(HOSTS) PER_HOST="$(PER_HOST)" SIZES="$(HOSTS_SIZES)" ROUNDS=$(ROUNDS) TORCH_PYTHON=$(PYTHON) \
		bench/baselines/run.sh > $(COMPARE_HOSTS_OUT)
	./$(BIN) bench report $(COMPARE_HOSTS_OUT)

# Recovery of a 4-worker DDP job (gloo, ~1M parameters) with one worker SIGKILLed, under
# torchrun, elasticd's restart mode (cold and --warm-start) and its in-process mode, interleaved
# ROUNDS times, medians and ratios to torchrun; then what a commit per step costs in-process
# against a plain DDP step (docs/benchmarks.md, "PyTorch, against torchrun" and "What a commit
# costs").
bench-pytorch: build
	$(PYTHON) bench/pytorch/recovery.py --rounds $(ROUNDS) --elasticd $(BIN) --out bench-pytorch-recovery.jsonl
	$(PYTHON) bench/pytorch/commit.py --rounds $(ROUNDS) --np 2 --elasticd $(BIN)
	$(PYTHON) bench/pytorch/commit.py --rounds $(ROUNDS) --np 4 --elasticd $(BIN)

# One driver with simulated hosts (docs/benchmarks.md, "One driver, thousands of hosts").
SCALE_HOSTS ?= 1000
SCALE_SLOTS ?= 8
bench-scale: build
	./$(BIN) bench scale --hosts $(SCALE_HOSTS) --slots $(SCALE_SLOTS)

# A soak (docs/reliability.md, "Soak"): an agent job on this machine (3 hosts on loopback
# addresses, 2 slots each) under faults drawn from SOAK_SEED for SOAK_DURATION (worker SIGKILL
# and SIGSTOP, agent SIGKILL and SIGSTOP, notices, a flapping slot, driver SIGKILL, SIGTERM
# and SIGSTOP, a worker SIGKILLed while the driver is down, two workers at once, discovery
# failing and hanging), then its whole history
# checked: every step once, no committed step lost, every sample once per epoch, stalls
# within bounds, exit 0, nothing left behind, descriptors and memory flat. Exits 1 on a
# violation. SOAK_PROGRAM: go (the demo trainer) or torch (elasticd.torch in-process).
# SOAK_FLAGS: more flags, e.g. SOAK_FLAGS=--netns (as root: hosts in network namespaces, and
# the network faults: cut-peers, cut-one-way, cut-driver, slow-link).
# soak-ci (.ci/run): seed 1, the Go program for 5 minutes, then PyTorch for 2.
SOAK_DURATION ?= 2h
SOAK_SEED     ?= 1
SOAK_PROGRAM  ?= go
SOAK_FLAGS    ?=
soak: build
	./$(BIN) bench soak --program $(SOAK_PROGRAM) --seed $(SOAK_SEED) --duration $(SOAK_DURATION) $(SOAK_FLAGS)

soak-ci: build
	./$(BIN) bench soak --seed 1 --duration 5m
	./$(BIN) bench soak --program torch --python $(PYTHON) --seed 1 --duration 2m

# Each fuzz target for FUZZTIME (go test -fuzz), one after the other. Their seed corpora
# (testdata/fuzz/) run as ordinary tests in `make test`; a failing input found here is
# written there, to keep as a regression test.
FUZZTIME ?= 30s
FUZZ_TARGETS = \
	allreduce:FuzzParseHeader allreduce:FuzzRecv \
	protocol:FuzzParseWorkerID protocol:FuzzReadFrame driver/rendezvous:FuzzServerRequest \
	driver/agents:FuzzAgentRequest \
	providers:FuzzParseHosts providers:FuzzDiscoveryScriptOutput \
	providers/aws:FuzzParseMessage \
	worker/agent/metadata:FuzzAWSNotices worker/agent/metadata:FuzzGCPNotices worker/agent/metadata:FuzzAzureNotices

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "== $${t%%:*} $${t##*:} ($(FUZZTIME))"; \
		$(GO) test ./$${t%%:*} -run '^$$' -fuzz "^$${t##*:}\$$" -fuzztime $(FUZZTIME); \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf bin
