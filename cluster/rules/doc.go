// Package rules holds the site's replication rules, Kafka's and KRaft's,
// as pure functions of state: no network, no Raft, no Serf, no store, no
// clock (pure_test.go fails the build of a change that adds one). The
// cluster package runs the loops that talk to all of those and calls in
// here with what they saw and the time.
package rules
