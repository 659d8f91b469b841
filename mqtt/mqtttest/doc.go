// Package mqtttest holds test fixtures for the mqtt package and its users:
//
//   - Raw (raw.go), a packet-level MQTT client for tests: rawmqtt.Conn
//     (package rawmqtt, beside this one) failing the test through
//     testing.TB, for what a full client such as paho hides from a test:
//     not reading, not acknowledging, resending a QoS 2 PUBLISH with the
//     same packet id, or sending malformed bytes. rawmqtt itself returns
//     errors and imports neither testing nor Peat, so cluster/sitetest
//     and cmd/peat-bench use it as well.
//   - MemLog (memlog.go, memstream.go), an in-memory offset log with the
//     shape of logstore.Store, that tests can steer: hold appends, make
//     them fail, drop old records as retention would.
//
// The contract every implementation of mqtt.Log keeps is written in
// mqtt/log.go and checked by the suite in package logtest (beside this
// one), which runs against MemLog (this package's tests) and against the
// Badger-backed logstore (edge's tests).
//
// Why two packages: the mqtt package's internal tests (package mqtt) use
// Raw and MemLog, so this package must not import mqtt, or those tests
// would form an import cycle. MemLog therefore returns its own concrete
// types (*MemStream, *MemState), as logstore.Store returns
// *logstore.Stream, and a few lines of adapter make it an mqtt.Log, as
// edge/storelog.go does for the Store. The contract suite needs the
// interface types, so it lives in logtest, which imports mqtt and is only
// imported by tests outside package mqtt.
//
// This package imports logstore (for Record and its sentinel errors) and
// nothing else of Peat's.
package mqtttest
