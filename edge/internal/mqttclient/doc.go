// Package mqttclient holds what Peat's MQTT clients toward an upstream
// share (the MQTT sink, edge/sink/mqttsink, and the MQTT source,
// edge/source/mqttsource): parsing the upstream's URL, dialling it (TCP,
// TLS) and the CONNECT/CONNACK exchange, reading one packet at a time
// with mochi's decoders, and the error type that names a failure's reason
// for the peat_sink_errors_total and peat_source_errors_total metrics.
//
// It is written on mochi's packet codec, with no queue of its own: each
// client decides what it keeps in flight.
package mqttclient
