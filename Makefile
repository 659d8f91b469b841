# Peat's make targets. `make run` and `make test` are the two a newcomer needs.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
export CGO_ENABLED = 0

.PHONY: all run build test test-cluster test-partition test-deps vet fmt-check lint fuzz bench bench-fanin bench-memory bench-pi bench-source pi cross test-arm clean

all: build

## run: build and run a single node on embedded defaults (data in ./data, MQTT 127.0.0.1:1883, HTTP 127.0.0.1:8080)
run: build
	./bin/peat serve

## build: the peat binary in bin/
build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/peat ./cmd/peat

## test: set up what the tests need, then vet, format check and the race-enabled test suite
test: test-deps vet fmt-check
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 15m ./...

## test-cluster: real-process fault tests of a three-node site (cluster/sitetest): leader, follower and controller kill -9, rolling restart, consumer group failover, a dead node's removal, a live node's drain, a mirror leader's kill, and (as root) two partition tests: the leader-controller link cut, the leader isolated; a few minutes
test-cluster: test-deps
	PEAT_SITETEST=1 PEAT_PARTITION=core CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 15m -v ./cluster/sitetest/

## test-partition: real network partitions of a site (cluster/sitetest, as root: a network namespace per node, nftables drops between them): leader, controller and follower cut off, the leader-controller and leader-follower links alone, 2/1 and 3/2 splits, a flapping link, SIGSTOP, kill -9 during a cut; 5 rounds each, a stall table per fault (scripts/bench-results/partition.md); about 30 minutes
test-partition: test-deps
	PEAT_SITETEST=1 PEAT_PARTITION=1 CGO_ENABLED=1 $(GO) test -race -count=1 -run 'TestPartition' -timeout 40m -v ./cluster/sitetest/ -sitetest.partition.rounds 5

test-deps:
	@./scripts/test-deps.sh

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

## lint: vet, format check, vet for 32-bit ARM (catches overflowing shifts), staticcheck
lint: vet fmt-check
	GOOS=linux GOARCH=arm GOARM=7 $(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

FUZZTIME ?= 5m

## fuzz: the fuzz targets of what clients and peers send, FUZZTIME each (default 5m, one worker): the whole ingress path of a real node, the guard's packet checks behind mochi's decoders, the guard's framing, the site's wire codec (decode, round trips, forwarded records); a failing input is written under the package's testdata/fuzz
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzIngress$$' -fuzztime $(FUZZTIME) -timeout 0 -parallel 1 ./edge/
	$(GO) test -run '^$$' -fuzz '^FuzzPacketCheck$$' -fuzztime $(FUZZTIME) -timeout 0 -parallel 1 ./mqtt/
	$(GO) test -run '^$$' -fuzz '^FuzzFramer$$' -fuzztime $(FUZZTIME) -timeout 0 -parallel 1 ./mqtt/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) -timeout 0 -parallel 1 ./cluster/wire/
	$(GO) test -run '^$$' -fuzz '^FuzzRoundTrip$$' -fuzztime $(FUZZTIME) -timeout 0 -parallel 1 ./cluster/wire/
	$(GO) test -run '^$$' -fuzz '^FuzzFwdRecord$$' -fuzztime $(FUZZTIME) -timeout 0 -parallel 1 ./cluster/

## bench: Go benchmarks of the hot paths (append, read from offset)
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./logstore/ ./mqtt/

## bench-fanin: Peat (fsync and interval) beside plain mochi, fan-in QoS 0 and QoS 1, ratios per repetition
bench-fanin:
	./scripts/bench-fanin.sh

## bench-source: a 1M-message cloud backlog drained into the edge: Peat's MQTT source beside Mosquitto's bridge (topic # in)
bench-source:
	./scripts/bench-source.sh

## bench-memory: broker RSS idle and with 1,000 QoS 1 sensors at 1 msg/s: Peat (pi-zero, pi), plain mochi, Mosquitto
bench-memory:
	./scripts/bench-memory.sh

## bench-pi: per storage profile, RSS idle, during a 1M-record QoS 1 ingest and with 1,000 clients, and bytes written to disk per record
bench-pi:
	./scripts/bench-pi.sh

## bench-connect: broker RSS and heap with 5,000 silent connections and 300 oversized CONNECT announcements, this tree against BASE
.PHONY: bench-connect
bench-connect:
	./scripts/bench-connect.sh

## bench-storm: 1,000 sensors with hashed passwords reconnect at once; connected clients' PINGRESP latency meanwhile
.PHONY: bench-storm
bench-storm:
	./scripts/bench-storm.sh

## bench-attack: sensors' connect latency while one address guesses passwords and holds silent sockets
.PHONY: bench-attack
bench-attack:
	./scripts/bench-attack.sh

## bench-disk: disk use under max_bytes retention for records of 16 B to 1 MiB, profiles pi-zero and server
.PHONY: bench-disk
bench-disk:
	./scripts/bench-disk.sh

## bench-sink: an edge takes 1,000,000 QoS 1 records while its upstream is down, then drains them: Peat's MQTT sink beside Mosquitto's bridge (RSS, drain rate, CPU per record)
.PHONY: bench-sink
bench-sink:
	./scripts/bench-sink.sh

## bench-replay: 1,000,000 stored 128-byte records replayed to one QoS 0 and one QoS 1 consumer: msg/s, gaps/dups, broker RSS idle and peak (issue 3 targets)
.PHONY: bench-replay
bench-replay:
	./scripts/bench-replay.sh

## bench-compare: every workload (W1-W6) on Mosquitto, mochi and Peat, fresh processes, REPS=3; markdown tables with ratios, and a chart, in scripts/.bench/
.PHONY: bench-compare
bench-compare:
	./scripts/bench.sh

## pi: static binaries in dist/ for linux arm64, armv7, armv6 and amd64, version-stamped, with SHA256SUMS
pi:
	GO=$(GO) VERSION=$(VERSION) COMMIT=$(COMMIT) ./scripts/cross.sh

## cross: the same as pi
cross: pi

## test-arm: under qemu-user: logstore and MQTT publish/subscribe/restart tests on arm64, 1M-record storage integrity on armv7/armv6, a three-node arm64 site with a leader kill
test-arm:
	GO=$(GO) ./scripts/test-arm.sh

clean:
	rm -rf bin dist
