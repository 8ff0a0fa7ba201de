# elasticd — see README.md. Every target works on a fresh Debian machine with Go >= 1.26.
GO      ?= go
BIN     := bin/elasticd
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: all build test demo bench bench-go bench-compare lint clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/elasticd

# The whole suite, with the race detector, as CI runs it.
test:
	$(GO) test -race -count=1 -timeout 20m ./...

# For now: an allreduce across 4 local processes, compared with this machine's limits.
demo: build
	./$(BIN) bench allreduce --np 4 --sizes 4KB,64KB,1MB,16MB,64MB

# The figures in docs/benchmarks.md: 2 and 4 ranks, 4 KB to 256 MB, then the Go benchmarks.
BENCH_SIZES ?= 4KB,64KB,1MB,16MB,64MB,256MB
bench: build
	./$(BIN) bench allreduce --np 2 --sizes $(BENCH_SIZES)
	./$(BIN) bench allreduce --np 4 --sizes $(BENCH_SIZES)
	$(MAKE) bench-go

bench-go:
	$(GO) test -run '^$$' -bench . -benchtime 20x -count 1 ./allreduce/

# elasticd, Gloo and Open MPI interleaved on this machine, ROUNDS times, then medians side by
# side (installs Gloo and Open MPI with apt-get). Raw lines stay in $(COMPARE_OUT).
ROUNDS      ?= 3
COMPARE_OUT ?= bench-compare.jsonl
bench-compare: build
	ROUNDS=$(ROUNDS) bench/baselines/run.sh > $(COMPARE_OUT)
	./$(BIN) bench report $(COMPARE_OUT)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf bin
