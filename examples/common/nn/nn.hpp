// nn: a tiny CPU neural-network framework, the stand-in for "your own framework" in
// unison's examples and tests. It does not use unison; see ../README.md.
//
//   matrix<T>                  row-major dense matrix
//   parameter<T>               values + grad (bindable to external storage)
//   linear<T>, relu<T>         layers with forward/backward
//   softmax_cross_entropy      loss and its gradient
//   mlp<T>                     linear/relu stack with autograd-style grad hooks
//   sgd<T>, adamw<T>           optimizers with PyTorch's update rules
//   make_classification, slice synthetic data
//
// T is float or double throughout.
#pragma once

#include "data.hpp"
#include "layers.hpp"
#include "matrix.hpp"
#include "mlp.hpp"
#include "optim.hpp"
#include "parameter.hpp"
#include "random.hpp"
