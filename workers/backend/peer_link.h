/*
 * Whether two GPUs are joined by NVLink, asked of NVML (libnvidia-ml.so.1,
 * part of the NVIDIA driver), which is loaded at run time so that gpuqd
 * needs it neither to build nor to run. CUDA says whether two GPUs can
 * reach each other's memory and how well, but not over which link; NVML's
 * P2P status for the NVLink capability does. Any thread; the CUDA backend
 * asks it once per pair when it opens a device.
 */
#ifndef GPUQ_PEER_LINK_H
#define GPUQ_PEER_LINK_H

#include <stddef.h>

/*
 * bus_a, bus_b: PCI bus ids as cudaDeviceGetPCIBusId gives them. Returns 1
 * when NVML reports NVLink peer-to-peer between the two, 0 when it reports
 * none, -1 when it cannot say (no NVML, a GPU it does not know), with the
 * reason in note.
 */
int peer_link_nvlink(const char *bus_a, const char *bus_b, char *note, size_t note_size);

#endif
