// node/'s name for host/json_fields.h, the one reader of JSON from other programs.
#ifndef EDGEACCEL_NODE_JSON_FIELDS_H_
#define EDGEACCEL_NODE_JSON_FIELDS_H_

#include "edgeaccel/host/json_fields.h"

#endif  // EDGEACCEL_NODE_JSON_FIELDS_H_
