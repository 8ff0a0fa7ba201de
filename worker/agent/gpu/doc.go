// Package gpu reports a host's GPUs and their health for the elasticd agent:
// an NVML inventory (slots = GPUs) and a stream of fatal XID, ECC and GPU-lost events.
//
// NVML needs cgo on Linux. Other builds, and hosts without a driver, see zero GPUs.
package gpu
