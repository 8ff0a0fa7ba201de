// Package gpu reports a host's GPUs and their health for the elasticd agent:
// an NVML inventory (slots = GPUs) and a stream of fatal XID, ECC and GPU-lost events; and,
// for `elasticd agent --check`, one look at NVML's health counters (Inspect) and at the PCI
// bus (NVIDIAPCI), which sees GPUs that no driver serves.
//
// NVML needs cgo on Linux. Other builds, and hosts without a driver, see zero GPUs.
package gpu
