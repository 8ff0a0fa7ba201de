// Package agents is the driver's side of `elasticd agent`: the registry of agents (one per
// GPU host), the HTTP protocol they speak with the driver (docs/protocol.md §4), the launcher
// that starts workers through them (--launcher agent), and the provider wrapper that offers
// only hosts whose agent is connected, with one slot per GPU.
//
// Agents dial the driver; the driver never dials an agent. Every request is signed with a key
// derived from the cluster's agent secret (--agent-secret-file), and so is every answer,
// because an agent runs the commands the answers carry. The job's own secret never crosses
// the network: the driver and each agent derive it from the agent secret and the job ID
// (JobSecret).
package agents
