// Package cluster will hold a site's replication: Serf membership, the
// Raft-backed controller, stream leadership, the ISR and replica fetch (see
// DESIGN.md, "Cluster"). Nothing is built yet: Peat runs as a single node,
// and the mqtt package reaches the log through mqtt.Log so that this package
// can stand in for the single-node log later.
package cluster
