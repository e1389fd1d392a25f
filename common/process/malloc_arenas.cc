#include "common/process/malloc_arenas.h"

#include <malloc.h>

namespace wb {

void LimitMallocArenas(int arenas) { mallopt(M_ARENA_MAX, arenas); }

void ReturnFreeMemory() { malloc_trim(0); }

}  // namespace wb
